"""``timeline presets``, ``timeline --help``: the table, the JSON list and the help examples."""

from __future__ import annotations

import json

import pytest

from timeline.cli import main
from timeline.spec.presets import PRESETS


def test_presets_json_lists_every_preset_with_its_fields(capsys):
    assert main(["presets", "--json"]) == 0
    doc = json.loads(capsys.readouterr().out)
    assert doc["schema"] == "timeline.presets/1"
    assert [p["name"] for p in doc["presets"]] == list(PRESETS)
    v3 = doc["presets"][0]["fields"]
    assert v3["model_type"] == PRESETS["deepseek-v3"].model_type and v3["hidden_size"] == 7168


def test_presets_table(capsys):
    assert main(["presets"]) == 0
    assert "llama3-8b" in capsys.readouterr().out


@pytest.mark.parametrize(("argv", "fragments"), [
    ([], ["timeline simulate schedules/deepseek-v3-pp16-tp2-ep8.toml", "timeline plot runs/deepseek-v3-pp16-tp2-ep8"]),
    (["presets"], ["timeline presets --json", "[model] preset"]),
])
def test_help_examples(argv, fragments, capsys):
    with pytest.raises(SystemExit):
        main([*argv, "--help"])
    out = capsys.readouterr().out
    examples = out[out.index("examples:"):]
    for fragment in fragments:
        assert fragment in out
    if not argv:  # the top level leads with simulate, then plot
        first = examples.splitlines()[1:3]
        assert "timeline simulate" in first[0] and "timeline plot" in first[1]
