"""The measured Megatron-LM jobs of ``../shared/measured/megatron_calibration.json`` (issue 11).

``from-megatron`` reads every configuration that has ``model_args``: the expressible ones (no
``expressible_note``) give run files that simulate, every other one is refused with one line that
names the argument or the model family. The simulated peak allocated of the last pipeline rank is
held to the error bands the profile reaches today — tightened as rules land, never widened to pass.
"""

from __future__ import annotations

import importlib.util
import json
import statistics
from pathlib import Path

import pytest

from timeline.errors import UserError
from timeline.io.megatron_args import from_mapping
from timeline.io.megatron_write import convert

ROOT = Path(__file__).resolve().parents[2]
DATA = ROOT.parent / "shared" / "measured" / "megatron_calibration.json"
pytestmark = pytest.mark.skipif(not DATA.exists(), reason=f"{DATA} is absent (the measured jobs live in ../shared)")

#: |error| bands reached today (percent), per family of cases with a published world size
MEDIAN_PCT = 0.5  # issue 11 asks 1 % (today 0.20 %)
# issue 11 asks 2 % (worst today: +1.83 %, the FP8 tp 4 cp 2 H100 case, compared since FP8 is modelled: its steady
# state is exact and its peak 7.4 MiB over, the same job on GB200 5.8 MiB under — unexplained; before it −0.98 %)
DENSE_WORST_PCT = 2.0
# issue 11 asks 4 %. Worst today: −1.45 %, dist_muon_1node (ep 4 on 4 GB200s), compared since the Muon states are
# modelled: its steady state is within +2.0 MiB, the ~51 MiB it lacks are in the activation peak (its muon_1node
# twin −1.04 %, +6.5 MiB steady; the param_layout_1node twin, of an inferred world size, −1.46 %, −2.5 MiB steady);
# before it +0.84 %, the a2a-overlap case without combined 1F1B
MOE_WORST_PCT = 1.5
# BERT (Megatron's BertModel, since graph/families/bert.py), its own family: worst today −2.23 %, bert_mcore_tp4_pp1
# (H100, TE 2.12), 69.5 MiB short at the loss with its steady state within 1 MiB; tp 1 within 0.3 %, tp 2 −1.7 %
# (the shortfall grows with tp, unexplained)
BERT_WORST_PCT = 2.5
# T5 (Megatron's T5Model, since graph/families/t5.py), its own family: worst today −1.53 %, t5_mcore_tp4_pp1_resume
# (the local spec at tp 4), whose steady state is 14.7 MiB short: the T5 goldens from Megatron-LM 4971290540
# (2025-09) hold 13–45 MiB more after iteration 1 than those of 65bd6f1e52 (2025-07), unexplained
T5_WORST_PCT = 2.0
# LLaVA (pretrain_vlm.py's LLaVAModel, since graph/families/llava.py), its own family: the one case, tp 1 pp 1 on an
# H100, −0.14 % (its steady state −3.0 MiB); the 52-wide heads run TE's torch softmax path (fp32)
LLAVA_WORST_PCT = 0.5
# Fine-grained activation offloading (since graph/offload.py and sim/offload.py), the one case: MLA + MoE at pp 2 × 4
# chunks with every module offloaded, −3.91 % (265 MiB short at iteration 2's peak, its steady state −6.9 MiB); the
# same model's Oct-2025 goldens (four modules, micro-batch 4) read −0.41 %: unexplained
OFFLOAD_CASES = frozenset({"moe/gpt3_moe_mcore_te_tp2_pp2_ep4_etp1_no_mtp_no_a2a_ovlp_fine_grained_offloading"})
OFFLOAD_WORST_PCT = 4.5


#: steady state after iteration 1 against measured allocated_bytes_first_iter, cases with a published world size
STEADY_PP1_MEDIAN_MIB = 1.5  # today 0.86 MiB over 35 pp = 1 cases
STEADY_PP_MEDIAN_MIB = 1.5  # today 0.92 MiB over 35 pp > 1 cases (13.0 before each chunk kept its last input)
STEADY_WORST_PCT = 4.0  # today 3.52 %: the a2a-overlap MoE case 52.5 MiB short (combined 1F1B not modelled)


def _records() -> list[dict]:
    return [r for r in json.loads(DATA.read_text()) if r.get("model_args")]


def _tool():
    spec = importlib.util.spec_from_file_location("validate_measured", ROOT / "tools" / "validate_measured.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


@pytest.fixture(scope="module")
def rows() -> tuple[list[dict], list]:
    failed: list = []
    return _tool().validate(json.loads(DATA.read_text()), failed=failed), failed


#: a resume with --ckpt-fully-parallel-load over a DP·CP group of 4 with EP 4: each expert shard is needed by one
#: rank, so the exchange skips it and the load is the plain one (timeline.io.megatron_state_args.fully_parallel_load)
NEMOTRON_EP4 = "nemotron/nemotron3_5_lightning_no_load_optim_tp1_pp1_cp1_ep4_dgx_gb200_1N4G"


def test_all_configs_read_expressible_convert_others_refused_by_name():
    records = _records()
    assert len(records) == 180
    tool = _tool()
    for r in records:
        fam = r["family_dir"]
        margs = from_mapping(r["model_args"], r.get("env"), family=fam, family_source=f"the path test_cases/{fam}/")
        world = r["parallel"]["world_size"] or 8
        if not tool.note_now(r):  # the note's kinds modelled now (optimizers, resumed runs, BERT) convert
            if r["parallel"]["world_size"] is None:  # bert_release: the dataset inferred no world size for BERT
                with pytest.raises(UserError, match="world size unknown"):
                    tool.convert_at_world_size(r, margs)
                continue
            tool.convert_at_world_size(r, margs)
            continue
        with pytest.raises(UserError) as exc:
            convert(margs, world_size=world)
        message = str(exc.value)
        assert "\n" not in message
        assert message.startswith("--") or " model (named by " in message, (r["name"], message)


def test_expressible_cases_simulate(rows):
    simulated, failed = rows
    # world size unknown
    assert [name for name, _ in failed] == ["bert/bert_release", "bert/bert_release_sm"]
    # 3 hybrid (Mamba) cases since graph/families/mamba.py, 5 Muon cases since graph/optim_state.py, the attn-scope
    # CUDA-graph MoE case since sim/graph_capture.py and its per-module-scope sibling (scoped_cudagraph) since
    # graph/cuda_graphs.py's module scopes, the two Megatron-FSDP gpt3 zp_z3 fsdp_dtensor goldens since
    # graph/fsdp_buffers.py, 3 BERT cases since graph/families/bert.py, the 8 T5 cases since graph/families/t5.py,
    # the LLaVA case since graph/families/llava.py, the fine-grained offloading case since graph/offload.py, the
    # Nemotron-3.5 hybrid MoE with MTP since its pattern's MTP depths and --mtp-use-repeated-layer (its
    # --data-parallel-sharding-strategy without Megatron-FSDP is DDP's), and the EP4 Nemotron-3.5 resume since its
    # fully parallel load is read as the plain one
    assert len(simulated) == 139
    assert NEMOTRON_EP4 in {r["name"] for r in simulated}


def test_an_inferred_world_size_megatron_s_schedule_refuses_falls_to_the_next_candidate(rows):
    """gpt3_15b_8t_release_sm_gb200's inferred 256 GPUs (dp 32) give the ramp's 384 samples as 3
    micro-batches on pp 2 × 2 chunks, a last group of 1 that Megatron's interleaved schedule refuses;
    the dataset's next candidate by residual, 128 (dp 16, 6 micro-batches), runs. Its measured memory is
    gpt3_15b_8t_release_sm's earlier golden (a tp 8 pp 1 job), so it is simulated but not compared."""
    by_name = {r["name"]: r for r in rows[0]}
    case = by_name["gpt/gpt3_15b_8t_release_sm_gb200"]
    assert (case["dataset_world_size"], case["world_size"]) == (256, 128)
    assert case["copy_of"] == "gpt/gpt3_15b_8t_release_sm"
    assert [r["name"] for r in rows[0] if r["copy_of"]] == [case["name"]]
    assert all(r["world_size"] == r["dataset_world_size"] for r in rows[0] if r is not case)
    text = _tool().table(rows[0])
    assert "not compared: gpt/gpt3_15b_8t_release_sm_gb200" in text
    all_line = next(line for line in text.splitlines() if line.startswith("all "))
    assert "n=138" in all_line  # the copy is left out of every statistic


def test_peak_allocated_within_the_bands_reached(rows):
    simulated, _ = rows
    published = [r for r in simulated if "inferred" not in r["family"]]
    # 3 hybrid (Mamba) cases, 3 Muon cases (the two param_layout Muon cases have an inferred world size), 1 CUDA-graph,
    # the two Megatron-FSDP fsdp_dtensor goldens, 3 BERT, 8 T5, 1 LLaVA, 1 fine-grained offloading, the
    # Nemotron-3.5 hybrid MoE with MTP and its EP4 resume (a fully parallel load)
    assert len(published) == 97
    errors = [abs(r["error_pct"]) for r in published]
    assert statistics.median(errors) <= MEDIAN_PCT
    bands = {"bert": BERT_WORST_PCT, "t5": T5_WORST_PCT, "llava": LLAVA_WORST_PCT}
    for r in published:
        band = MOE_WORST_PCT if r["family"].startswith("moe") else bands.get(r["family"], DENSE_WORST_PCT)
        if r["name"] in OFFLOAD_CASES:
            band = OFFLOAD_WORST_PCT
        assert abs(r["error_pct"]) <= band, (r["name"], r["error_pct"])


def test_each_case_runs_under_the_pytorch_of_its_container():
    """The container comes from Megatron-LM's ``docker/.ngc_version.dev`` at the commit whose goldens
    hold the memory values; the bump to 26.04 (5fe3f06) is where Blackwell's default cuBLAS workspace
    grew (PyTorch 2.12)."""
    tool = _tool()
    by_name = {r["name"]: r for r in _records()}
    assert tool.pytorch_of(by_name["gpt/gpt3_mcore_te_tp2_pp2_cp2_nondeterministic_1node"]) == "2.11"  # 26.02
    bumped = by_name["gpt/gpt3_mcore_te_tp2_pp2_cp2_1node"]
    assert bumped["memory_values_first_commit"].startswith("5fe3f06658") and tool.pytorch_of(bumped) == "2.12"
    # the same configuration measured in both containers: steady state up by two workspaces' growth,
    # 2 · (32 − 8.125) MiB = 47.75 MiB, within the 1 MiB other changes of the bump account for
    grew = bumped["measured"]["allocated_bytes"] - bumped["previous_memory_values"]["alloc_last"][1]
    assert abs(grew - 2 * (32 * 2**20 - 8_519_680)) < 2**20


def test_each_case_runs_under_the_transformer_engine_megatron_pinned():
    """Megatron-LM's pyproject pins the TE its CI image builds; Blackwell's deterministic attention
    backend follows it (a GB200 case recorded on TE 2.14 with attention dropout runs flash attention)."""
    tool = _tool()
    by_name = {r["name"]: r for r in _records()}
    gb200 = by_name["gpt/gpt3_mcore_te_tp1_pp1_resume_torch_dist_dist_optimizer_1node"]
    assert gb200["memory_values_first_commit_date"] == "2026-04-17" and tool.te_of(gb200) == "2.14"
    assert tool.te_of(by_name["gpt/gpt3_mcore_te_tp2_pp2_cp2_1node"]) == "2.14"  # 2026-05-07, before 2.15
    assert tool.te_of({"memory_values_first_commit": "f32b2731ac00", "memory_values_first_commit_date": "2025-09-23"}) \
        == "2.7"
    # before the pyproject pin, Dockerfile.ci.dev's TE_COMMIT: bee4649 (2.2.0.dev0) from the 25.03 bump
    assert tool.te_of({"memory_values_first_commit_date": "2025-07-01"}) == "2.2"
    # before it, NGC 24.10's own (the 24.10 bump 66e5306871 of 2025-01-21; the first collected goldens are of 01-23)
    assert tool.te_of({"memory_values_first_commit_date": "2025-03-01"}) == "1.11"
    assert tool.te_of({"memory_values_first_commit_date": "2025-01-20"}) is None  # no case is that old


def _lts(date: str, commit: str = "", container: str | None = None) -> dict:
    return {"memory_values_first_commit": commit, "memory_values_first_commit_date": date,
            "software": {"container": container},
            "measured": {"golden_file": "tests/functional_tests/test_cases/gpt/x/golden_values_lts_dgx_a100.json"}}


def test_lts_cases_run_under_the_lts_image():
    """The lts image: NGC 24.01 and its own TE until 23a1dcaf74 (2025-11-06), NGC 25.09 and its own TE until
    cb3d5d9c40 added ``--extra te`` (the dev pin), and from 97b25d9d7b TE b9d690e042 (2.16)."""
    tool = _tool()
    shared = next(r for r in _records() if "golden_values_lts" in r["measured"]["golden_file"])
    assert tool.is_lts(shared) and shared["memory_values_first_commit_date"] == "2025-10-21"
    assert (tool.pytorch_of(shared), tool.te_of(shared)) == ("2.2", "1.2")  # the dev image then: 25.09, TE 2.8
    assert tool.family(shared) == "moe (inferred world size, lts image)"
    assert (tool.pytorch_of(_lts("2026-01-10")), tool.te_of(_lts("2026-01-10"))) == ("2.9", "2.7")
    assert tool.te_of(_lts("2026-05-10")) == tool.te_of({"memory_values_first_commit_date": "2026-05-10"}) == "2.14"
    assert tool.te_of(_lts("2026-08-20")) == "2.16"
    # eb48e81bd7 moved the lts image to 25.09 and 75f87c21ef reverted it the same day: the commit decides
    assert tool.te_of(_lts("2025-11-05", "eb48e81bd7" + "0" * 30)) == "2.7"
    assert tool.te_of(_lts("2025-11-05", "75f87c21ef" + "0" * 30)) == "1.2"
    # a collected record's own container decides over the date (23a1dcaf74 replayed the bump on 11-06)
    assert tool.te_of(_lts("2025-11-06", "0" * 40, container="25.09")) == "2.7"
    assert tool.pytorch_of(_lts("2025-11-06", "0" * 40, container="25.09")) == "2.9"


def test_the_2026_deterministic_moe_twin_matches(rows):
    """The twin of a 2025-10 case recorded in the 26.04 container peaks 48.7 MiB higher with the same steady
    state: one [rows, h] bf16 expert output per MoE layer that the deterministic unpermute's index_add_
    keeps (12 layers × 4096 rows × 512 × 2 B = 48 MiB; it was −2.41 % without it); with it, and Megatron's
    data-parallel state, the case is within 0.25 % (−0.12 %)."""
    by_name = {r["name"]: r for r in rows[0]}
    case = by_name["moe/gpt3_mcore_te_tp2_pp1_resume_torch_dist_te_8experts2parallel_dist_optimizer"]
    assert abs(case["error_pct"]) < 0.25, case["error_pct"]


def test_steady_state_within_the_bands_reached(rows):
    """What static state decides: weights, the padded grad (and param) buffers, the optimizer's shards and
    moments, the main-grad copies and the persistent workspaces, after iteration 1's step; on a pipeline's
    last stage also each chunk's last received input and its gradient."""
    published = [r for r in rows[0] if "inferred" not in r["family"] and r["steady_measured"] is not None]
    # 3 hybrid (Mamba) cases, 3 Muon cases (the two param_layout Muon cases have an inferred world size), 1 CUDA-graph,
    # the two Megatron-FSDP fsdp_dtensor goldens, 3 BERT, 8 T5, 1 LLaVA, 1 fine-grained offloading, the
    # Nemotron-3.5 hybrid MoE with MTP and its EP4 resume (a fully parallel load)
    assert len(published) == 97
    pp1 = [abs(r["steady_predicted"] - r["steady_measured"]) / 2**20 for r in published if r["pp"] == 1]
    assert statistics.median(pp1) <= STEADY_PP1_MEDIAN_MIB
    pipelined = [abs(r["steady_predicted"] - r["steady_measured"]) / 2**20 for r in published if r["pp"] > 1]
    # + the pp2 vpp2 hybrid, the pp2 vpp4 CUDA-graph case, the BERT pp 2 and pp 4 × vpp 3 cases, the offloading case
    assert len(pipelined) == 42 and statistics.median(pipelined) <= STEADY_PP_MEDIAN_MIB
    for r in published:
        pct = 100.0 * abs(r["steady_predicted"] - r["steady_measured"]) / r["steady_measured"]
        assert pct <= STEADY_WORST_PCT, (r["name"], pct)


def test_a_renamed_golden_is_simulated_as_recorded():
    """Megatron-LM's adc69dba2d (2025-10-21) renamed the ``gpt3_mr_*_dgx_a100_1N8G`` test directories and
    their goldens without re-measuring: the top2router golden's bytes were written by cb12e3dea4 (2025-04-04,
    "Bump PyT to 25.03") under ``gpt3_mr_..._top2router_dgx_a100_1N8G/``, whose model_config.yaml then had no
    ``--no-bias-gelu-fusion``. It runs in that commit's software: Megatron-Core 0.12.0rc0 (package_info.py),
    TE_COMMIT bee4649 (2.2.0.dev0), NGC PyTorch 25.03 (2.7)."""
    tool = _tool()
    prov = tool.load_provenance()
    rec = next(r for r in _records() if r["name"] == "moe/gpt3_mcore_te_tp2_pp1_resume_torch_dist_te_8experts2parallel_top2router")
    assert rec["memory_values_first_commit"].startswith("adc69dba2d") and rec["model_args"]["--no-bias-gelu-fusion"]
    entry = prov[rec["name"]]
    assert entry["kind"] == "renamed" and entry["recorded_path"].endswith(
        "moe/gpt3_mr_mcore_te_tp2_pp1_resume_torch_dist_te_8experts2parallel_top2router_dgx_a100_1N8G/golden_values_dev.json")
    as_rec = tool.as_recorded(rec, prov)
    assert as_rec["memory_values_first_commit"].startswith("cb12e3dea4")
    assert as_rec["memory_values_first_commit_date"] == "2025-04-04"
    assert "--no-bias-gelu-fusion" not in as_rec["model_args"]
    assert as_rec["model_args"]["--timing-log-level"] == 2  # memory-neutral, applied all the same
    assert (tool.megatron_of(as_rec), tool.te_of(as_rec), tool.pytorch_of(as_rec)) == ("0.12.0rc0", "2.2", "2.7")
    assert rec["model_args"]["--no-bias-gelu-fusion"]  # the dataset's record is not modified


MIXTRAL_RELEASE = ("mixtral/mixtral_8x7b_alltoall_tp2pp4ep4_release", "mixtral/mixtral_8x7b_alltoall_tp2pp4ep4_release_sm")


def test_a_release_golden_runs_in_its_release_branch_image():
    """The Mixtral 8x7B release goldens were committed to main by e2d16c01a9 (2025-06-27), when main's CI built
    TE bee4649 (2.2.0.dev0) on NGC 25.03, but recorded as Megatron-Core 0.13.0's release validation
    (``golden_values_0.13.0_te2.5_dgx_h100_dev.json``): core_r0.13.0's image, NGC 25.05 (PyTorch 2.8) with TE
    8382eed (release_v2.5). An lts release golden, or a release not listed, keeps the dates' tables."""
    tool = _tool()
    prov = tool.load_provenance()
    for name in MIXTRAL_RELEASE:
        rec = tool.as_recorded(next(r for r in _records() if r["name"] == name), prov)
        assert rec["memory_values_first_commit"].startswith("e2d16c01a9")
        assert tool.release_of(rec) == "0.13.0"
        assert (tool.megatron_of(rec), tool.te_of(rec), tool.pytorch_of(rec)) == ("0.13.0", "2.5", "2.8")
        main_then = {k: rec[k] for k in ("memory_values_first_commit", "memory_values_first_commit_date")}
        assert (tool.megatron_of(main_then), tool.te_of(main_then), tool.pytorch_of(main_then)) == \
            ("0.14.0rc0", "2.2", "2.7")
    lts = {"measured": {"golden_file": "x/golden_values_0.12.0_dgx_a100_lts.json"},
           "memory_values_first_commit_date": "2025-04-28"}
    assert tool.release_of(lts) is None
    assert tool.release_of({"measured": {"golden_file": "x/golden_values_0.9.0_dgx_h100_dev.json"}}) is None


def test_the_mixtral_release_holds_te_2_5_s_dummy_wgrads_on_its_last_stage():
    """What the release image moves: TE ≥ 2.3 keeps one bf16 dummy weight gradient per main_grad shape of its
    linears (``module/base.py: get_dummy_wgrad``). On the last of 4 stages at tp 2 (h 4096, 32 heads, 8 query
    groups of 128): linear_qkv [(4096 + 2·1024)/2, 4096] = 25,165,824 bytes and linear_proj [4096, 4096/2] =
    16,777,216 — 40 MiB, what the measured steady state holds above TE 2.2's (41,032,192 bytes, 39.13 MiB); the
    grouped experts (TE < 2.10), the router and the output layer (Megatron-Core < 0.15) take none."""
    import tomllib

    from timeline.io.megatron_write import run_file_text
    from timeline.io.runfile import run_from_data
    from timeline.result.build import build_timeline

    tool = _tool()
    rec = tool.as_recorded(next(r for r in _records() if r["name"] == MIXTRAL_RELEASE[1]), tool.load_provenance())
    world, conv = tool.convert_at_world_size(rec, from_mapping(rec["model_args"], rec.get("env"), family="mixtral",
                                                               family_source="x"))
    assert world == 128
    run = run_from_data(tomllib.loads(run_file_text(conv, name="x", source="x", world_size=world)), Path("x.toml"))
    tl = build_timeline(run)
    last = max(range(tl.num_devices), key=lambda d: tl.devices[d].pp_rank)
    ev = tl.events(last)
    dummies = {tl.names[t]: int(size) for t, size, sign in zip(ev.tensor, ev.size, ev.sign, strict=True)
               if sign > 0 and tl.names[t].startswith("workspace.te_dummy_wgrad")}
    assert dummies == {"workspace.te_dummy_wgrad_3072x4096": 3072 * 4096 * 2,
                       "workspace.te_dummy_wgrad_4096x2048": 4096 * 2048 * 2}


def test_a_golden_recorded_at_its_own_commit_is_unchanged():
    tool = _tool()
    prov = tool.load_provenance()
    rec = next(r for r in _records() if r["name"] == "moe/gpt3_mcore_te_tp2_pp1_resume_torch_dist_te_8experts2parallel_dist_optimizer")
    assert not prov[rec["name"]]["recorded_earlier"]
    assert prov[rec["name"]]["recorded_commit"] == rec["memory_values_first_commit"]
    assert tool.as_recorded(rec, prov) is rec


def test_a_golden_copied_from_another_test_keeps_its_record():
    """gpt3_15b_8t_release_sm_gb200's golden is gpt3_15b_8t_release_sm's (still a test): not its own
    configuration's measurement, so it is not re-configured (and not compared)."""
    tool = _tool()
    prov = tool.load_provenance()
    rec = next(r for r in _records() if r["name"] == "gpt/gpt3_15b_8t_release_sm_gb200")
    assert prov[rec["name"]]["kind"] == "copied"
    assert tool.as_recorded(rec, prov) is rec


def test_the_provenance_covers_every_expressible_case_and_the_tables_match_its_commits():
    """Every expressible case has an entry; where a golden is older than its path, the Megatron-Core
    table gives the version that commit's package_info.py names."""
    tool = _tool()
    prov = tool.load_provenance()
    records = _records()
    assert set(prov) == {r["name"] for r in tool.expressible(records)}
    earlier = {n: e for n, e in prov.items() if e["recorded_earlier"]}
    assert len(earlier) == 38
    for name, e in earlier.items():
        at = {"memory_values_first_commit": e["recorded_commit"], "memory_values_first_commit_date": e["recorded_date"]}
        assert tool.megatron_of(at) == e["megatron_core"], name
        assert tool.te_of(at) is not None and tool.pytorch_of(at) is not None, name


MEGATRON_GIT = ROOT.parent / ".mirror" / "NVIDIA+Megatron-LM" / "repo"


@pytest.mark.skipif(not MEGATRON_GIT.exists(), reason="no Megatron-LM clone here (CI has none)")
def test_the_committed_provenance_is_what_the_history_gives():
    spec = importlib.util.spec_from_file_location("golden_provenance", ROOT / "tools" / "golden_provenance.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    made = module.provenance(str(MEGATRON_GIT), json.loads(DATA.read_text()))
    assert made == json.loads((ROOT / "tools" / "golden_provenance.json").read_text())


def test_the_2025_moe_cases_unpermute_by_scatter_add(rows):
    """Before Megatron-LM 56818f9e50 (2025-10-16, core_r0.15.0) the deterministic unpermute ran scatter_add_,
    keeping no [rows, h] source: the two top-1 MoE goldens recorded in 2025-05 (Megatron-Core 0.13.0rc0) are
    within 0.25 % without the 12 × 4096 × 512 × 2 B = 48 MiB an index_add_ would keep (+2.19 %, +1.66 %
    with it)."""
    by_name = {r["name"]: r for r in rows[0]}
    for name in ("moe/gpt3_mcore_te_tp2_pp1_frozen_resume_torch_dist_te_8experts2parallel_dist_optimizer",
                 "moe/gpt3_mcore_te_tp2_pp1_frozen_resume_torch_dist_te_8experts2parallel_groupedGEMM"):
        assert by_name[name]["recorded_at"] in ("194b2be238", "c6b08c2e5a")
        assert abs(by_name[name]["error_pct"]) < 0.25, (name, by_name[name]["error_pct"])


def test_each_moe_case_multiplies_the_probs_where_its_commit_did():
    """Megatron-LM 2659630721 (2025-04-09, main at 0.12.0rc0, first released in 0.13.0rc0; never on core_r0.12)
    moved the routing-probability multiply from the combine into the experts."""
    tool = _tool()

    def rec(core: str, commit: str, date: str) -> dict:
        return {"software": {"megatron_core": core}, "memory_values_first_commit": commit,
                "memory_values_first_commit_date": date}

    assert not tool.probs_in_experts_of(rec("0.12.0rc0", "cb12e3dea4", "2025-04-04"))
    assert tool.probs_in_experts_of(rec("0.12.0rc0", "2659630721ac", "2025-04-09"))
    assert not tool.probs_in_experts_of(rec("0.12.1", "0123456789", "2025-05-01"))  # the 0.12 release line
    assert tool.probs_in_experts_of(rec("0.13.0rc0", "795f135561", "2025-04-10"))


def test_the_moe_goldens_recorded_before_2659630721_keep_the_combine_s_product(rows):
    """Two GeLU top-k MoE goldens recorded at cb12e3dea4 (2025-04-04), before the probs moved into the experts:
    the combine keeps the experts' [rows, h] output, not the [rows, ffn] activation the later multiply keeps
    (12 layers × 4096 rows × (1024 − 512) × 2 B = 48 MiB a routed row per top-k); +2.71 % and +2.90 % with the
    later rule."""
    by_name = {r["name"]: r for r in rows[0]}
    for name in ("moe/gpt3_mcore_te_tp2_pp1_resume_torch_dist_te_8experts2parallel_groupedGEMM",
                 "moe/gpt3_mcore_te_tp2_pp1_resume_torch_dist_te_8experts2parallel_top2router"):
        assert by_name[name]["recorded_at"] == "cb12e3dea4"
        assert abs(by_name[name]["error_pct"]) < 1.0, (name, by_name[name]["error_pct"])
