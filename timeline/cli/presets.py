"""``timeline presets``: list the model presets a run file can name, as a table or JSON."""

from __future__ import annotations

import argparse
import dataclasses
import json

from rich.table import Table

from timeline.cli.common import console
from timeline.spec.presets import PRESETS

HELP = "list model presets ([model] preset = NAME)"
DESCRIPTION = """\
List the model presets: architectures a run file names with [model] preset = "NAME" (and
`timeline capture --preset NAME` builds). The table shows the shapes; --json prints every field
of every preset (the same fields a [model] section or a Hugging Face config.json sets).

examples:
  timeline presets
  timeline presets --json
"""
SCHEMA = "timeline.presets/1"


def prepare_parser(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--json", action="store_true",
                        help=f"print {SCHEMA} JSON: a list of presets, each its name and every model field")


def presets_json() -> dict:
    return {"schema": SCHEMA,
            "presets": [{"name": name, "fields": dataclasses.asdict(m)} for name, m in PRESETS.items()]}


def run(args: argparse.Namespace) -> int:
    if args.json:
        print(json.dumps(presets_json(), indent=1, default=list))
        return 0
    table = Table(title="model presets")
    for col in ("preset", "type", "layers", "hidden", "heads", "kv heads", "ffn", "vocab", "experts", "MTP"):
        table.add_column(col)
    for name, m in PRESETS.items():
        experts = f"{m.n_routed_experts}+{m.n_shared_experts} top-{m.num_experts_per_tok}" if m.is_moe else "-"
        attn = "MLA" if m.is_mla else str(m.kv_heads)
        table.add_row(name, m.model_type, str(m.num_hidden_layers), str(m.hidden_size),
                      str(m.num_attention_heads), attn, str(m.intermediate_size), str(m.vocab_size),
                      experts, str(m.mtp_layers))
    console().print(table)
    return 0
