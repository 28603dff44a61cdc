"""Every argument of Megatron-LM's training parser, at every release core_v0.12.0 … main, is classified.

``tests/data/megatron/parser_args.json`` is the parser as ``tools/megatron_parser_args.py`` built it
per version (facts, with provenance); the table is :mod:`timeline.io.megatron_table`. The tests
report every offender at once: an option string of some version in no class, a class entry that is
an option string of no version (stale), an argument in two classes, a mapped argument the mapping
does not read (or one it reads that is not listed), and the run-time index disagreeing with the facts.
"""

from __future__ import annotations

import json
import re
from pathlib import Path

import pytest

from timeline.io import megatron_table as table
from timeline.io.megatron_legacy import CHECKED_ONLY as LEGACY_CHECKED
from timeline.io.megatron_neutral import UNDER
from timeline.io.megatron_state_args import CHECKED_ONLY
from timeline.io.megatron_vlm import VLM_ARGS

ROOT = Path(__file__).resolve().parents[2]
FACTS = ROOT / "tests" / "data" / "megatron" / "parser_args.json"
BETWEEN = ROOT / "tests" / "data" / "megatron" / "parser_args_between.json"
BETWEEN_INDEX = ROOT / "timeline" / "io" / "megatron_parser_between.json"
INDEX = ROOT / "timeline" / "io" / "megatron_parser_versions.json"
MAPPING_SOURCES = ("timeline/io/megatron_map.py", "timeline/io/megatron_framework.py",
                   "timeline/io/megatron_state_args.py", "timeline/io/megatron_cp.py", "timeline/io/megatron_legacy.py",
                   "timeline/io/megatron_optimizer.py", "timeline/io/megatron_bert.py", "timeline/io/megatron_t5.py",
                   "timeline/io/megatron_tokenizer.py", "timeline/io/megatron_vlm.py", "timeline/io/megatron_offload.py")


@pytest.fixture(scope="module")
def facts() -> dict:
    return json.loads(FACTS.read_text())


@pytest.fixture(scope="module")
def between() -> dict:
    return json.loads(BETWEEN.read_text())["arguments"]


def _places() -> dict[str, list[str]]:
    places: dict[str, list[str]] = {}
    for where, names in (("mapped", table.MAPPED), ("neutral", table.NEUTRAL_REASON), ("refused", table.REFUSED),
                         ("family", table.FAMILY_ARGS)):
        for name in names:
            places.setdefault(name, []).append(where)
    return places


def test_every_argument_of_every_version_is_classified(facts, between):
    places = _places()
    missing = {name: row["versions"] for name, row in facts["arguments"].items() if name not in places}
    missing |= {name: "between releases" for name in between if name not in places and not _under(name)}
    assert not missing, f"{len(missing)} arguments in no class (mapped / neutral / refused): {missing}"


def _under(name: str) -> bool:
    return any(name in params for params in UNDER.values())


def test_no_class_entry_is_an_argument_of_no_version(facts, between):
    args = facts["arguments"] | between
    stale = sorted(n for n in _places() if n not in args)
    stale += sorted(f"{n} (REFUSED_UNLESS)" for n in table.REFUSED_UNLESS if n not in args)
    stale += sorted(f"{p} (UNDER parent)" for parent in UNDER for p in re.findall(r"--[\w-]+", parent)
                    if p not in args)
    # another script's arguments and other frameworks' names must not be the training parser's
    stale += sorted(f"{n} (OTHER_SCRIPTS / NOT_MEGATRON, yet in the parser)"
                    for n in [*table.OTHER_SCRIPTS, *table.NOT_MEGATRON] if n in args)
    assert not stale, f"stale table entries: {stale}"


def test_no_argument_is_in_two_classes():
    twice = {name: where for name, where in _places().items() if len(where) > 1}
    assert not twice, twice


def test_the_mapped_class_is_what_the_mapping_reads():
    read = set()
    for rel in MAPPING_SOURCES:
        read |= set(re.findall(r'"(--[a-z0-9][\w-]*)"', (ROOT / rel).read_text()))
    # read only to name the model family they build, then refused: a MIMO script's argument, --spec
    read -= {"--model-provider", *table.REFUSED}
    # pretrain_vlm.py's own parser group (add_vlm_extra_args), not the training parser's
    read -= set(VLM_ARGS)
    # neutral ones read only to refuse what Megatron itself rejects (megatron_state_args.py),
    # and with the legacy model (megatron_legacy.py)
    assert {*CHECKED_ONLY, *LEGACY_CHECKED} <= set(table.NEUTRAL_REASON)
    read -= {*CHECKED_ONLY, *LEGACY_CHECKED}
    assert sorted(read - set(table.MAPPED)) == []
    # the value-gated ones are read through REFUSED_UNLESS (megatron_map.py: refuse_unmodelled)
    assert set(table.REFUSED_UNLESS) <= set(table.MAPPED)
    assert sorted(set(table.MAPPED) - read - set(table.REFUSED_UNLESS)) == []


def test_the_run_time_index_is_the_facts(facts):
    index = json.loads(INDEX.read_text())
    labels = [v["label"] for v in facts["provenance"]["versions"]]
    assert [v[0] for v in index["versions"]] == labels
    assert set(index["arguments"]) == set(facts["arguments"])
    for name, row in facts["arguments"].items():
        present = "".join("1" if any(labels.index(a) <= i <= labels.index(b) for a, b in row["versions"]) else "0"
                          for i in range(len(labels)))
        assert index["arguments"][name] == present, name


def test_the_facts_cover_every_release_and_main(facts):
    versions = facts["provenance"]["versions"]
    assert [v["label"] for v in versions] == [
        "core_v0.12.0", "core_v0.12.1", "core_v0.12.2", "core_v0.12.3", "core_v0.13.0", "core_v0.13.1",
        "core_v0.14.0", "core_v0.15.0", "core_v0.15.1", "core_v0.15.2", "core_v0.15.3", "core_v0.16.0",
        "core_v0.16.1", "core_v0.17.0", "core_v0.17.1", "core_v0.18.0", "core_v0.18.2", "core_v0.19.0", "main"]
    assert versions[-1]["commit"].startswith("d98e8a64dd")
    assert all(re.fullmatch(r"[0-9a-f]{40}", v["commit"]) for v in versions)
    # each version's option strings, counted from the rows, match what its build reported
    for v in versions:
        count = sum(1 for row in facts["arguments"].values()
                    if any(_between(v["label"], a, b, versions) for a, b in row["versions"]))
        assert count == v["options"], v["label"]


def _between(label: str, first: str, last: str, versions: list[dict]) -> bool:
    order = [v["label"] for v in versions]
    return order.index(first) <= order.index(label) <= order.index(last)


def test_facts_read_off_the_parser(facts):
    args = facts["arguments"]
    # a deprecated alias and its canonical name are one action
    assert args["--override-opt_param-scheduler"]["aliases"] == ["--override-opt-param-scheduler"]
    assert args["--override-opt_param-scheduler"]["dest"] == "override_opt_param_scheduler"
    # dataclass-generated negations: a bool defaulting to True becomes --no-X and --disable-X (core_v0.16+)
    assert args["--disable-tp-comm-bulk-dgrad"]["aliases"] == ["--no-tp-comm-bulk-dgrad"]
    assert args["--no-tp-comm-bulk-dgrad"]["versions"] == [["core_v0.16.0", "main"]]
    assert args["--cp-comm-type"]["default"] == "['p2p']" and args["--cp-comm-type"]["nargs"] == "+"
    assert args["--step-batch-size-schedule"]["versions"] == [["core_v0.18.0", "main"]]
    assert args["--use-legacy-models"]["versions"] == [["core_v0.12.0", "core_v0.17.1"]]
    # pretrain_gpt.py passes ModelOpt's arguments as its extra_args_provider from core_v0.13.0
    assert args["--export-kd-teacher-load"]["versions"][0][0] == "core_v0.13.0"
    assert args["--export-kd-teacher-load"]["source"] == "megatron/post_training/arguments.py:add_modelopt_args"


def test_arguments_of_main_between_releases(facts, between):
    """Read off every parser-file commit of the release lines and the dev branch since core_v0.12.0; none is in a
    built version,
    each has its first and last commit, and the run-time copy is the facts."""
    assert set(between).isdisjoint(facts["arguments"])
    assert "--initialize-socket-comms" in between and "--max-seqlen-per-cp-rank" in between
    row = between["--max-seqlen-per-cp-rank"]
    # first on the dev branch (274e04d21f, 2025-12-04), before main's 98d8c56dbd
    assert (row["first"][:10], row["source"]) == ("274e04d21f", "megatron/training/arguments.py:_add_distributed_args")
    # the dev head's built parser adds the names it generates from config dataclasses
    assert between["--enable-hyper-connections"]["first"][:10] == "d48bd6be0a"
    assert all(r["first_date"] <= r["last_date"] and re.fullmatch(r"[0-9a-f]{40}", r["first"] + r["last"][:0])
               for r in between.values())
    index = json.loads(BETWEEN_INDEX.read_text())["arguments"]
    assert index == {k: [r["first"][:10], r["first_date"], r["last"][:10], r["last_date"]] for k, r in between.items()}
