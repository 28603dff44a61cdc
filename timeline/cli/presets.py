"""``timeline presets``: list the model presets a run file can name."""

from __future__ import annotations

import argparse

from rich.table import Table

from timeline.cli.common import console
from timeline.spec.presets import PRESETS

HELP = "list model presets ([model] preset = NAME)"


def prepare_parser(parser: argparse.ArgumentParser) -> None:
    pass


def run(args: argparse.Namespace) -> int:
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
