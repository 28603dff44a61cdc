"""The held-out split of Megatron-LM's measured test cases and the records collected beyond the calibration set
(issue 31 item 5): ``tools/megatron_split.py`` / ``tools/megatron_split.json``, ``tools/collect_megatron_cases.py``,
and the parts ``tools/validate_measured.py --set`` reports (``tools/measured_report.py``)."""

from __future__ import annotations

import hashlib
import importlib.util
import json
import subprocess
import sys
from collections import defaultdict
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
TOOLS = ROOT / "tools"
DATA = ROOT.parent / "shared" / "measured" / "megatron_calibration.json"
MEGATRON_GIT = ROOT.parent / ".mirror" / "NVIDIA+Megatron-LM" / "repo"
MANIFEST = json.loads((TOOLS / "megatron_split.json").read_text())
needs_data = pytest.mark.skipif(not DATA.exists(), reason=f"{DATA} is absent (the measured jobs live in ../shared)")
needs_git = pytest.mark.skipif(not MEGATRON_GIT.exists(), reason="no Megatron-LM mirror here (CI has none)")


def _tool(name: str):
    if str(TOOLS) not in sys.path:
        sys.path.insert(0, str(TOOLS))  # the tools import their siblings by name
    spec = importlib.util.spec_from_file_location(name, TOOLS / f"{name}.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_the_hash_rule_is_the_documented_one():
    split = _tool("megatron_split")
    for key in ("gpt/gpt3_mcore_te_tp1_pp2", "moe/deepseek_proxy_ep4", "t5/t5_mcore_tp4_pp1"):
        bucket = int(hashlib.sha256(b"timeline-heldout-v1:" + key.encode()).hexdigest(), 16) % 3
        assert split.hashed_side(key) == ("calibration" if bucket == 2 else "unseen")
    assert MANIFEST["salt"] == "timeline-heldout-v1:"


@needs_data
def test_every_side_is_recomputed_from_the_rule_and_no_unseen_name_is_shared():
    split = _tool("megatron_split")
    shared = {r["name"] for r in json.loads(DATA.read_text())}
    cases = MANIFEST["cases"]
    assert shared <= set(cases) and MANIFEST["shared_names"] == len(shared) == 181
    members: dict[str, set[str]] = defaultdict(set)
    for name, entry in cases.items():
        members[entry["group"]].add(name)
    for key, names in members.items():
        assert key == min(names)  # a group is keyed by its alphabetically first name
        want = "calibration" if names & shared else split.hashed_side(key)
        assert {cases[n]["side"] for n in names} == {want}, key
    assert not {n for n, e in cases.items() if e["side"] == "unseen"} & shared
    assert MANIFEST["counts"] == {"calibration": 424, "unseen": 249}


@needs_git
@needs_data
def test_the_split_is_what_the_history_gives():
    """The names and rename links from ``git log --all``: the same manifest when the mirror's refs are those
    it was made at; on a mirror that moved on, every case of the manifest still there on the same side."""
    split = _tool("megatron_split")
    made = split.split(MEGATRON_GIT, split.shared_names(DATA))
    if made["refs_digest"] == MANIFEST["refs_digest"]:
        assert split.dumps(made) == (TOOLS / "megatron_split.json").read_text()
    else:
        assert set(MANIFEST["cases"]) <= set(made["cases"])
        moved = [n for n, e in MANIFEST["cases"].items() if made["cases"][n]["side"] != e["side"]]
        assert not moved, moved[:5]


def test_a_rename_links_two_directories_a_copy_does_not():
    split = _tool("megatron_split")
    golden = "tests/functional_tests/test_cases/{}/golden_values_dev_dgx_h100.json"
    log = "\n".join([
        "C " + "a" * 40 + " 2 2025-10-21",  # newest first: a rename (deleted under old, added under new)
        f":100644 000000 {'1' * 40} {'0' * 40} D\t{golden.format('gpt/old_name')}",
        f":000000 100644 {'0' * 40} {'1' * 40} A\t{golden.format('gpt/new_name')}",
        "C " + "b" * 40 + " 1 2025-10-20",  # a copy: the source stays
        f":000000 100644 {'0' * 40} {'2' * 40} A\t{golden.format('gpt/copied')}",
        f":000000 100644 {'0' * 40} {'2' * 40} A\t{golden.format('gpt/source')}",
        f":000000 100644 {'0' * 40} {'1' * 40} A\t{golden.format('gpt/old_name')}",
        f":000000 100644 {'0' * 40} {'3' * 40} A\ttests/functional_tests/test_cases/moe2.0/golden_values/"
        "dsv3_x/golden_values_dev_dgx_h100.json",
    ])
    names, links = split.names_and_links(log)
    assert names == {"gpt/old_name", "gpt/new_name", "gpt/copied", "gpt/source", "moe2.0/dsv3_x"}
    assert links == {("gpt/new_name", "gpt/old_name")}
    assert split.groups(names, links)["gpt/old_name"] == "gpt/new_name"


def test_golden_names_and_series():
    rec = _tool("megatron_case_record")
    assert rec.golden_tag("x/golden_values_dev_dgx_gb200.json") == {
        "tag": "dev_dgx_gb200", "environment": "dev", "gpu": "GB200", "second": False, "release": False}
    assert rec.golden_tag("x/golden_values_lts_dgxa100_dracooci-ord.json")["gpu"] == "A100"
    assert rec.golden_tag("x/golden_values_dev_dgx_h100_2nd.json")["second"]
    assert rec.golden_tag("x/golden_values_0.13.0_PyT25.05_dgx_a100_dev.json")["release"]
    assert rec.golden_tag("x/golden_values_dev.json")["gpu"] is None
    listed = {"mem-max-allocated-bytes": {"start_step": 0, "step_interval": 5, "values": [10.0, "nan", 30.0]}}
    assert rec.series(listed, "mem-max-allocated-bytes") == [(0, 10.0), (10, 30.0)]
    m = rec.measured({"mem-max-allocated-bytes": {"values": {"1": 7.0, "2": 9.0, "3": 9.0}},
                      "mem-allocated-bytes": {"values": {"1": 4.0, "2": 5.0, "3": 3.0}}})
    assert m["max_allocated_bytes_second_logged"] == {"iter": 2, "bytes": 9}
    assert m["max_allocated_bytes_overall"] == {"iter": 2, "bytes": 9}
    assert (m["allocated_bytes_first_iter"], m["allocated_bytes"], m["allocated_bytes_range"]) == (4, 3, [3, 5])
    assert rec.measured({"mem-max-allocated-bytes": {"values": {"1": 7.0}}}) is None
    assert rec.runner_env('export NCCL_PROTO="${NCCL_PROTO:-simple}"\nexport X="${Y:-1}"\n') == {"NCCL_PROTO": "simple"}


def test_the_expressible_note_names_each_kind():
    rec = _tool("megatron_case_record")
    dev = rec.golden_tag("x/golden_values_dev_dgx_h100.json")
    config = {"TEST_TYPE": "regular", "MODEL_ARGS": {"--num-layers": 2, "--use-distributed-optimizer": True}}
    assert rec.expressible_note("gpt", config, dev) is None
    fp8_graphs = {"MODEL_ARGS": {"--fp8-format": "hybrid", "--cuda-graph-impl": "transformer_engine",
                                 "--optimizer": "muon"}}
    assert rec.expressible_note("moe", fp8_graphs, dev) == (
        "fp8/fp4 training; CUDA graphs (graph memory pools); optimizer muon (not Adam)")
    lts = rec.golden_tag("x/golden_values_lts_dgx_a100.json")
    assert rec.expressible_note("t5", config, lts) == "T5 encoder-decoder model"
    assert rec.expressible_note("gpt", config, lts) is None  # validate_measured tables the lts image's versions
    assert rec.expressible_note("gpt", None, dev) == "no model_config.yaml at the recording commit"
    # a resumed run's _2nd golden is expressible: validate_measured simulates it resumed
    second = rec.golden_tag("x/golden_values_dev_dgx_h100_2nd.json")
    assert rec.expressible_note("gpt", config, second) is None
    scoped = {"--cuda-graph-impl": "transformer_engine", "--cuda-graph-scope": "[attn mamba]"}
    old = {"expressible_note": "the _2nd golden of a resumed run: loads a checkpoint before the measured iterations; "
                               "fp8/fp4 training; CUDA graphs (graph memory pools)",
           "measured": {"golden_tag": "dev_dgx_h100_2nd"}, "model_args": scoped}
    # the load and FP8 are modelled now, TE's graphs of whole layers or of their attention, MLP and MoE router too:
    # what is left is the Mamba layers' graphs, narrowed to the argument from-megatron refuses
    assert rec.note_now(old) == "CUDA graphs not modelled: --cuda-graph-scope attn mamba"
    assert rec.note_now(old | {"model_args": scoped | {"--cuda-graph-scope": "[attn mlp moe_router]"}}) is None
    assert rec.resumed_run(old)
    assert rec.note_now(old | {"model_args": scoped | {"--cuda-graph-scope": "attn"}}) is None
    assert rec.note_now(old | {"model_args": {"--enable-cuda-graph": True}}) == \
        "CUDA graphs not modelled: --enable-cuda-graph"
    assert rec.note_now({"expressible_note": rec.MODELLED_NOTES[0]}) is None
    frozen = {"TEST_TYPE": "frozen-start", "MODEL_ARGS": {"--num-layers": 2, "--finetune": True}}
    assert rec.expressible_note("gpt", frozen, dev) is None
    assert rec.resumed_run({"test_type": "frozen-start", "measured": {"golden_tag": "dev_dgx_h100"}})


def test_moe2_configs_merge_as_megatron_s_merge_config():
    rec = _tool("megatron_case_record")
    merged = rec.merged_config({"MODEL_ARGS": {"--a": 1, "--b": 1}, "TEST_TYPE": "regular"},
                               {"MODEL_ARGS": {"--b": 2}}, {"MODEL_ARGS": {"--c": 3}, "TEST_TYPE": "ckpt-resume"})
    assert merged == {"MODEL_ARGS": {"--a": 1, "--b": 2, "--c": 3}, "TEST_TYPE": "ckpt-resume"}


@needs_git
@needs_data
def test_one_calibration_golden_is_extracted_to_the_byte():
    """moe/gpt3_mcore_te_tp2_pp1_resume_torch_dist_te_8experts2parallel_dist_optimizer's H100 golden as 5fe3f06658
    (2026-05-07, the 26.04 container bump) wrote it: blob 66a948b166, mem-max-allocated-bytes 1921322496.0 at
    iteration 1, 2156503040.0 at 2, 2159231488.0 at 100; mem-allocated-bytes 892870144.0 at 1, 892851712.0 at
    100. The CI recipe h100/moe.yaml runs it on 1 node × 8 GPUs with pretrain_gpt.py."""
    collect = _tool("collect_megatron_cases")
    name = "moe/gpt3_mcore_te_tp2_pp1_resume_torch_dist_te_8experts2parallel_dist_optimizer"
    assert MANIFEST["cases"][name]["side"] == "calibration"
    commit = "5fe3f06658b393283eafc32f039c3d0c2468a69f"
    path = f"tests/functional_tests/test_cases/{name}/golden_values_dev_dgx_h100.json"
    repo = collect.Repo(MEGATRON_GIT)
    blob = repo.git("rev-parse", f"{commit}:{path}").strip()
    assert blob == "66a948b166647b1454b400b9581706897e64e2cd"
    made = collect.record(repo, collect.AtCommit(repo), blob, commit, "2026-05-07", path,
                          MANIFEST["cases"][name], "HEAD")
    m = made["measured"]
    assert (m["first_iter"], m["last_iter"], m["n_logged"]) == (1, 100, 100)
    assert m["max_allocated_bytes_first_iter"] == 1_921_322_496
    assert m["max_allocated_bytes_second_logged"] == {"iter": 2, "bytes": 2_156_503_040}
    assert m["max_allocated_bytes_last_iter"] == 2_159_231_488
    assert (m["allocated_bytes_first_iter"], m["allocated_bytes"]) == (892_870_144, 892_851_712)
    assert m["gpu"].startswith("H100") and m["global_rank"] == 7
    par = made["parallel"]
    assert (par["world_size"], par["nodes"], par["gpus_per_node"]) == (8, 1, 8)
    assert par["recipe"] == "tests/test_utils/recipes/h100/moe.yaml" and (par["tp"], par["ep"]) == (2, 2)
    assert made["model_family"] == "gpt" and made["software"] == {"megatron_core": "0.18.0", "container": "26.04"}
    assert made["env"]["NCCL_BUFFSIZE"] == "4194304"  # _run_training.sh's default
    assert made["env"]["CUBLAS_WORKSPACE_CONFIG"] == ":4096:8"  # the config's ENV_VARS
    assert made["expressible_note"] is None
    shared = next(r for r in json.loads(DATA.read_text()) if r["name"] == name)
    assert made["model_args"] == shared["model_args"]  # as written in model_config.yaml there


def test_the_report_keeps_unseen_to_aggregates():
    report = _tool("measured_report")
    records = [{"name": f"gpt/c{i}", "side": side, "model_args": {"--num-layers": 2}, "expressible_note": note}
               for i, (side, note) in enumerate([("calibration", None), ("unseen", None), ("unseen", None),
                                                 ("unseen", "fp8/fp4 training; CUDA graphs (graph memory pools)")])]
    labels = [(label, [r["name"] for r in recs], per_case) for label, recs, per_case in
              report.parts("all", [], records)]
    assert labels == [("calibration: the shared dataset", [], True), ("calibration: collected", ["gpt/c0"], True),
                      ("unseen", ["gpt/c1", "gpt/c2", "gpt/c3"], False)]
    assert [label for label, _r, _p in report.parts("shared", [], records)] == ["calibration: the shared dataset"]
    rows = [{"name": "gpt/c1", "family": "dense", "error_pct": -0.5, "steady_predicted": 99, "steady_measured": 100,
             "golden_tag": "dev_dgx_h100", "date": "2026-01-01"}]
    failed = [("gpt/c2", "--cp-comm-type: not a Megatron-LM argument timeline knows; '2' is …")]
    text = "\n".join(report.summary("unseen", records[1:], rows, failed))
    assert "gpt/c" not in text  # no case name in the unseen part
    assert "n=   1  median  0.50%  p90  0.50%  worst   0.50%  within 1/2/4 %: 1/1/1" in text
    assert "refused by from-megatron: 1 records (1 cases)" in text and "'…' is …" in text
    assert "1  fp8/fp4 training" in text and "1  CUDA graphs (graph memory pools)" in text


@needs_data
def test_a_missing_cases_file_is_one_line_and_exit_2(tmp_path):
    done = subprocess.run([sys.executable, str(TOOLS / "validate_measured.py"), "--set", "unseen", "--cases",
                           str(tmp_path / "none.json")], capture_output=True, text=True, timeout=60)
    assert done.returncode == 2 and done.stdout == ""
    assert done.stderr.strip().splitlines() == [
        f"validate_measured: --cases {tmp_path / 'none.json'}: no collected records there; run "
        f"tools/collect_megatron_cases.py first (it writes {Path.home() / '.cache/timeline/megatron-cases.json'} "
        "by default)"]


def test_a_commit_gate_follows_ancestry_where_the_date_misleads():
    """``validate_measured.holds``: a recording commit listed in ``tools/megatron_gates.json`` holds a rule's
    Megatron-LM commit by its ancestry — the dev branch's 1fe78252e9 (2026-05-29) lacks main's 5e4fc931ba
    (2026-05-21) — and any other by date (the dev branch's 06ecac391e of 2026-04-08, package_info 0.16.0rc0,
    has d3528a2130 of 2026-03-06 as its date says; its version alone would not say it)."""
    vm = _tool("validate_measured")

    def rec(commit: str, date: str) -> dict:
        return {"commit": commit, "commit_date": date, "measured": {}}

    table = json.loads((TOOLS / "megatron_gates.json").read_text())["gates"]
    assert table["5e4fc931ba"]["holds"]["1fe78252e9"] is False
    assert vm.holds(rec("06ecac391e" + "0" * 30, "2026-04-08"), vm.ROUTER_TE_GEMM, table) is True
    assert vm.holds(rec("1fe78252e9" + "0" * 30, "2026-05-29"), vm.KEEPS_BATCH, table) is False
    assert vm.holds(rec("ffffffffff" + "0" * 30, "2026-05-29"), vm.KEEPS_BATCH, table) is True  # unlisted: by date
    assert vm.holds(rec("ffffffffff" + "0" * 30, "2026-05-20"), vm.KEEPS_BATCH, table) is False
    assert vm.holds(rec("5e4fc931ba" + "0" * 30, "2026-05-21"), vm.KEEPS_BATCH, {}) is True  # the commit itself
    assert vm.router_te_gemm_of({**rec("06ecac391e" + "0" * 30, "2026-04-08"),
                                 "software": {"megatron_core": "0.16.0rc0"}}) is True
    # Megatron-Core 0.17 and later have it by version: the flag is left off
    assert vm.router_te_gemm_of({**rec("06ecac391e" + "0" * 30, "2026-04-08"),
                                 "software": {"megatron_core": "0.18.0"}}) is False


def test_the_megatron_fsdp_package_follows_the_version_and_else_af28b5a559():
    """``validate_measured.fsdp_package_of``: releases by version (0.13.x never, 0.14.0 on always), main's and the
    release branch's 0.14.0rc / 0.15.0rc by the recording commit (af28b5a559, 2025-08-21)."""
    vm = _tool("validate_measured")

    def rec(commit: str, date: str, version: str) -> dict:
        return {"commit": commit + "0" * 30, "commit_date": date, "measured": {},
                "software": {"megatron_core": version}}

    assert vm.fsdp_package_of(rec("ffffffffff", "2025-09-01", "0.13.1")) is False
    assert vm.fsdp_package_of(rec("ffffffffff", "2025-06-01", "0.14.0")) is True
    assert vm.fsdp_package_of(rec("ffffffffff", "2025-12-01", "0.16.0rc0")) is True
    assert vm.fsdp_package_of(rec("ffffffffff", "2025-08-19", "0.15.0rc0")) is False  # main before it
    assert vm.fsdp_package_of(rec("af28b5a559", "2025-08-21", "0.15.0rc0")) is True
    assert vm.fsdp_package_of(rec("ffffffffff", "2025-08-27", "0.14.0rc7")) is True  # the release branch's pick


@needs_git
def test_the_gate_table_is_what_the_history_gives(tmp_path):
    """``tools/megatron_gates.json`` is regenerated to the byte from the Megatron-LM mirror (it reads the git
    graph only), and lists every gate ``validate_measured`` holds."""
    vm = _tool("validate_measured")
    out = tmp_path / "gates.json"
    subprocess.run([sys.executable, str(TOOLS / "megatron_gates.py"), str(MEGATRON_GIT), "-o", str(out)], check=True)
    committed = json.loads((TOOLS / "megatron_gates.json").read_text())
    regenerated = json.loads(out.read_text())
    if committed["main_head"] != regenerated["main_head"]:
        pytest.skip("the mirror moved on since the table was written")
    assert regenerated == committed
    assert set(committed["gates"]) == {bump for table in vm.GATES for _since, bump, _ in table}
