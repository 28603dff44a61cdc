"""Hold the simulator against measured Megatron-LM jobs (``../shared/measured/megatron_calibration.json``).

Every expressible case (``expressible_note`` empty, ``model_args`` present) goes through
``timeline from-megatron`` (in process) and a 2-iteration simulation with summary output only; the
last pipeline rank's device — global rank ``world_size − 1`` under Megatron's rank order — is
compared with ``measured.max_allocated_bytes_second_logged``. Prints predicted, measured and error per
case, then median and worst |error| per family (dense / MoE, published / inferred world size, the CI's
dev / lts image), the counts within 1, 2 and 4 %, and the wall time. ``--json FILE`` also writes the rows.
Each case runs under the Megatron-Core, PyTorch and Transformer Engine of the CI image it was recorded in
(the tables below: the dev image's and the lts image's, from each commit on).

The steady state is compared too: what the device holds after iteration 1's optimizer step (the
blocks of the static state's and iteration 1's events) against ``measured.allocated_bytes_first_iter``, which
``training_log()`` logged then — weights, gradients, optimizer state and persistent workspaces, no
activations. Cases whose first logged iteration is not 1 (a resumed run's goldens) have no steady
column.

Beyond the calibration dataset, ``--set`` takes the cases ``tools/collect_megatron_cases.py`` collected
(``--cases``, default ``~/.cache/timeline/megatron-cases.json``) on either side of the held-out split
(``tools/megatron_split.json``): the report prints each part apart — calibration with its per-case rows,
unseen as aggregates only (``tools/measured_report.py``) — and counts every record not compared by its
reason (``expressible_note`` kinds, ``from-megatron``'s one-line refusals).

    .venv/bin/python tools/validate_measured.py [--set shared|calibration|unseen|all] [--cases PATH]
                                                [--data PATH] [--only SUBSTRING] [--json FILE]
"""

from __future__ import annotations

import argparse
import functools
import json
import sys
import time
import tomllib
from pathlib import Path
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from timeline.io.megatron_args import MegatronArgs
    from timeline.io.megatron_map import Conversion
    from timeline.result.timeline import Timeline

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "tools"))
DEFAULT_DATA = ROOT.parent / "shared" / "measured" / "megatron_calibration.json"

from measured_report import gap_lines, table  # noqa: E402  (the per-case table lives beside the part summaries)
from megatron_case_record import golden_tag, note_now, resumed_run  # noqa: E402  (the notes' kinds live with the collection)

from timeline.io.megatron_table import VLM_FAMILIES  # noqa: E402

#: measured.gpu prefix → --gpu
GPU_KINDS = {"H100": "h100", "GB200": "gb200", "A100": "a100", "B200": "b200", "H200": "h200"}


#: Megatron-LM's CI "dev" container from each commit on: before ``docker/.ngc_version.dev`` existed (2025-11),
#: the ``BASE_IMAGE`` of the ``CI_MCORE_DEV_IMAGE`` build in ``.gitlab/stages/01.build.yml`` (before 037c198b97,
#: 2025-03-19, the same matrix in ``.gitlab/stages/01.test.yml``: 24.10 from 66e5306871 "bump-pyt-24.10")
#: (``git log --first-parent -G 'BASE_IMAGE: nvcr.io/nvidia/pytorch' -- .gitlab/stages/01.build.yml``; a
#: bump's own branch commit is listed where goldens were re-recorded in it: cb12e3dea4 "Bump PyT to 25.03",
#: merged by f0f6231455; 2795ebde97 "Upgrade to 25.05-py3-devel image", merged by cc0bdfbdde), then the
#: container ``docker/.ngc_version.dev`` names (``git log -- docker/.ngc_version.dev`` in NVIDIA/Megatron-LM),
#: with the PyTorch release line of the main-branch snapshot that NGC's ``pytorch:YY.MM`` container ships (NGC's
#: release notes: 25.12 is based on 2.10.0a0+b4e4ee81d3; each container takes main about a month before it
#: ships, and main is X.Y.0a0 from the X−1 release branch cut on). Only the PyTorch version's effect on the
#: default cuBLAS workspace of Blackwell GPUs depends on it here (2.12 is the first with 32 MiB there);
#: the GB200 goldens re-recorded at the 26.04 bump (5fe3f06) show it: the same configurations'
#: steady-state allocated rose by 47.0 MiB, two workspaces of 32 − 8.125 MiB. Before 66e5306871
#: (2025-01-21) no entry: no measured case was recorded earlier (the first collected ones are of 2025-01-23).
DEV_CONTAINERS = (  # (from date, commit, container, PyTorch)
    ("2025-01-21", "66e5306871", "24.10", "2.5"),
    ("2025-04-04", "cb12e3dea4", "25.03", "2.7"),
    ("2025-07-05", "2795ebde97", "25.05", "2.8"),
    ("2025-08-05", "71328b89b6", "25.06", "2.8"),
    ("2025-10-14", "44ab057fef", "25.09", "2.9"),
    ("2025-11-05", "eb48e81bd7", "25.09", "2.9"),
    ("2026-01-14", "82049aa847", "25.11", "2.10"),
    ("2026-03-05", "f5b2ec0130", "26.02", "2.11"),
    ("2026-05-07", "5fe3f06658", "26.04", "2.12"),
    ("2026-07-08", "64bee49c96", "26.06", "2.13"),
)


#: The Transformer Engine Megatron-LM's CI image builds from each commit on. Until 2025-08-05,
#: ``Dockerfile.ci.dev``'s ``ARG TE_COMMIT`` (``git log --first-parent -G TE_COMMIT= -- Dockerfile.ci.dev``), its
#: version read from that commit's ``build_tools/VERSION.txt`` in NVIDIA/TransformerEngine; before cb12e3dea4
#: the Dockerfile built none and the NGC 24.10 container's own TE ran: TE's ``release_v1.11`` branch left main
#: on 2024-09-17 and ``release_v1.12`` on 2024-10-16, after 24.10's snapshot, so 1.11 (no rule here
#: distinguishes 1.x releases: the earliest TE gate is 2.3). From 2025-08-06 ``docker/Dockerfile.ci.dev``
#: runs ``uv sync --extra te --locked``: ``pyproject.toml``'s ``[tool.uv.sources] transformer-engine`` git rev
#: (``git log --first-parent -- pyproject.toml`` in NVIDIA/Megatron-LM), its version read from that rev's
#: ``build_tools/VERSION.txt`` in NVIDIA/TransformerEngine (a ``release_vX.Y`` branch is X.Y). Where the
#: source line was commented out (2025-11-25 to 2025-12-04) the PyPI range ``>=2.9.0a0,<2.10.0`` stood.
TE_PINS = (  # (from date, commit, TE)
    ("2025-01-21", "66e5306871", "1.11"),   # NGC 24.10's own TE (Dockerfile.ci.dev builds none)
    ("2025-04-04", "cb12e3dea4", "2.2"),    # TE_COMMIT bee4649 (main, 2.2.0.dev0); merged by f0f6231455
    ("2025-07-05", "2795ebde97", "2.5"),    # TE_COMMIT 8382eed (release_v2.5, 2.5.0); merged by cc0bdfbdde
    ("2025-08-05", "71328b89b6", "2.6"),    # TE_COMMIT b97c2bf (release_v2.6, 2.6.0)
    ("2025-08-06", "cc227f797c", "2.6"),    # rev c90a720 (release_v2.6)
    ("2025-09-23", "f32b2731ac", "2.7"),    # rev 0289e76 (release_v2.7)
    ("2025-10-21", "adc69dba2d", "2.8"),    # release_v2.8
    ("2025-10-22", "754dfa2de4", "2.9"),    # release_v2.9 (committed 2025-10-21, after adc69db)
    ("2025-12-05", "b9d3736e91", "2.10"),   # release_v2.10 ("build: Bump TE to 2.10")
    ("2026-01-14", "82049aa847", "2.11"),   # release_v2.11 ("build: 26.02 dependency bump main")
    ("2026-02-09", "30695913bd", "2.12"),   # rev d9b7fc5
    ("2026-03-11", "da469460be", "2.13"),   # rev 2877704
    ("2026-04-09", "b5354a82fc", "2.14"),   # rev 71bbefb
    ("2026-05-28", "4f2e7ce74a", "2.15"),   # rev 42b8400
    ("2026-05-30", "6e091e1b68", "2.16"),   # rev f8a01cd ("Update transformer-engine dependency to version 2.16.0")
    ("2026-07-14", "834abc1950", "2.17"),   # rev 2e559f0
    ("2026-08-11", "0c1fc4c5c9", "2.18"),   # rev e7c550c
    ("2026-08-22", "2c8ac9b753", "2.17"),   # rev 4329ff8 (2.17.1)
)


#: Megatron-LM's CI "lts" image from each commit on (55622ff6ab, 2024-10-18, added it): until 2025-11 the
#: ``BASE_IMAGE`` of the ``CI_MCORE_LTS_IMAGE`` build (``.gitlab/stages/01.test.yml``, from 037c198b97
#: ``01.build.yml``), NGC 24.01; then ``docker/.ngc_version.lts``, NGC 25.09 (eb48e81bd7 "ci: LTS container",
#: reverted by 75f87c21ef the same day, replayed as 23a1dcaf74). ``git log --first-parent -G CI_MCORE_LTS_IMAGE
#: -- .gitlab docker/.ngc_version.lts`` in NVIDIA/Megatron-LM; unchanged to d98e8a64dd. PyTorch: NGC's release
#: notes (24.01 is based on 2.2.0a0+81ea7a4, 25.09 on 2.9.0a0). A collected record names the container its
#: commit's CI built (``software.container``), which decides over the dates (two bumps fell on one day).
LTS_CONTAINERS = (  # (from date, commit, container, PyTorch)
    ("2024-10-18", "55622ff6ab", "24.01", "2.2"),
    ("2025-11-05", "eb48e81bd7", "25.09", "2.9"),
    ("2025-11-05", "75f87c21ef", "24.01", "2.2"),
    ("2025-11-06", "23a1dcaf74", "25.09", "2.9"),
)


#: The Transformer Engine an NGC PyTorch container ships, by the date its release branch left TE's main
#: (``git log`` of NVIDIA/TransformerEngine; a container takes its snapshot about a month before it ships):
#: 24.01 — release_v1.2 left main 2023-12-15, release_v1.3 2024-01-16; 25.09 — release_v2.7 left main
#: 2025-08-18 (v2.7 tagged 2025-08-28; release_v2.7.post0 2025-09-24), release_v2.8 on 2025-09-18.
NGC_TE = {"24.01": "1.2", "25.09": "2.7"}


#: The Transformer Engine of the lts image from each commit on: "container" — the NGC container's own
#: (:data:`NGC_TE`): Dockerfile.ci.lts installed ``requirements/pytorch_24.01`` (no TE), then from cc3ed64b0c
#: ``uv sync --extra lts`` (the ``lts`` extra lists no TE), and from 23a1dcaf74 Dockerfile.ci.dev with
#: ``--extra ${IMAGE_TYPE}`` (lts); "dev" — the dev image's pin (:data:`TE_PINS`): cb3d5d9c40 added ``--extra te``
#: to Dockerfile.ci.dev for both image types, and 4f2e7ce74a's own Dockerfile.ci.lts kept it; then 97b25d9d7b
#: installs ``transformer-engine @ …@b9d690e042`` (release_v2.16.post, ``build_tools/VERSION.txt`` 2.16.0).
LTS_TE = (  # (from date, commit, TE | "container" | "dev")
    ("2024-10-18", "55622ff6ab", "container"),
    ("2026-04-29", "cb3d5d9c40", "dev"),
    ("2026-07-14", "97b25d9d7b", "2.16"),
)


#: Megatron-Core's version on Megatron-LM's main branch from each commit on
#: (``git log --first-parent -- megatron/core/package_info.py``: MAJOR.MINOR.PATCH + PRE_RELEASE); the
#: calibration cases were recorded from 2025-03 on (``golden_provenance.json`` holds each recording
#: commit's own ``package_info.py`` version, and the tests hold this table to it).
MC_VERSIONS = (  # (from date, commit, Megatron-Core)
    ("2025-02-13", "5575cfc1e9", "0.12.0rc0"),
    ("2025-04-10", "795f135561", "0.13.0rc0"),
    ("2025-06-17", "27c9b6c2c0", "0.14.0rc0"),
    ("2025-07-07", "3450806c96", "0.14.0rc1"),
    ("2025-07-14", "5e798111e6", "0.14.0rc2"),
    ("2025-07-21", "41cd4e9fed", "0.14.0rc3"),
    ("2025-07-28", "6e49f19b9a", "0.14.0rc4"),
    ("2025-08-04", "bbb4c5fbf7", "0.14.0rc5"),
    ("2025-08-11", "3da9032a4d", "0.14.0rc6"),
    ("2025-08-18", "79d04bed3d", "0.14.0rc7"),
    ("2025-08-18", "8e11c520e4", "0.15.0rc0"),
    ("2025-08-25", "48406695c4", "0.15.0rc1"),
    ("2025-09-01", "3271c42838", "0.15.0rc2"),
    ("2025-09-02", "402549482f", "0.15.0rc3"),
    ("2025-09-08", "ba97a7e282", "0.15.0rc4"),
    ("2025-09-15", "2fbece51ec", "0.15.0rc5"),
    ("2025-09-22", "c78fb08765", "0.15.0rc6"),
    ("2025-09-29", "e65669313a", "0.15.0rc7"),
    ("2025-10-06", "f3452948bb", "0.15.0rc8"),
    ("2025-10-21", "4666de7a28", "0.16.0rc0"),
    ("2026-03-31", "e1db3211a0", "0.17.0rc0"),
    ("2026-03-31", "f09f5c98e6", "0.18.0rc0"),
    ("2026-04-09", "2f5c62c312", "0.18.0"),
    ("2026-06-03", "7a7f7b4130", "0.19.0"),
    ("2026-07-29", "efb3963f3c", "0.20.0"),
)


def _recorded(record: dict) -> tuple[str, str]:
    """(commit, date) the case's memory values were recorded at (the dataset's; :func:`as_recorded`
    replaces them where the golden's bytes are older than its path)."""
    commit = str(record.get("memory_values_first_commit") or record.get("commit") or "")
    date = str(record.get("memory_values_first_commit_date") or record.get("commit_date") or "")
    return commit, date


def _pinned(record: dict, history: tuple[tuple[str, str, str], ...]) -> str | None:
    """The value of ``history`` (date, commit, value) in force when the case was recorded."""
    commit, date = _recorded(record)
    version = None
    for since, bump, value in history:
        if date > since or commit.startswith(bump):
            version = value
    return version


#: The CI image of a Megatron-Core release branch, in which that release's validation goldens
#: (``golden_values_X.Y.Z[_…]_<platform>_dev.json``: :func:`golden_tag`'s ``release``) were recorded — not main's
#: image of the day the golden was committed: version → (NGC container, Transformer Engine). core_v0.13.0:
#: ``docker/Dockerfile.ci.dev`` ``ARG TE_COMMIT=8382eed`` (release_v2.5, ``build_tools/VERSION.txt`` 2.5.0) and
#: ``.gitlab/stages/01.build.yml``'s ``CI_MCORE_DEV_IMAGE`` ``BASE_IMAGE: nvcr.io/nvidia/pytorch:25.05-py3``
#: (core_r0.13.0's 8e8c98192b); the goldens name it themselves (e2d16c01a9, 2025-06-27:
#: ``mixtral_8x7b_alltoall_tp2pp4ep4_release_sm/golden_values_0.13.0_te2.5_dgx_h100_dev.json``,
#: ``gpt3_15b_8t_release_sm/golden_values_0.13.0_PyT25.05_TE2.5_dgx_h100_dev.json``), while main's CI then still
#: built TE bee4649 (2.2.0.dev0) on 25.03. The steady state shows it: TE ≥ 2.3's cached dummy weight gradients
#: (40 MiB on the Mixtral release's last stage) are in the measured bytes.
RELEASE_IMAGES = {"0.13.0": ("25.05", "2.5")}


def release_of(record: dict) -> str | None:
    """The Megatron-Core release whose branch image recorded the case's golden (:data:`RELEASE_IMAGES`), by the
    name of the golden as recorded (``recorded_as``'s path, from :func:`as_recorded`, else the measured file); None
    for a golden of main's CI, an lts golden, or a release not listed."""
    path = str((record.get("recorded_as") or {}).get("recorded_path")
               or (record.get("measured") or {}).get("golden_file") or "")
    if not path:
        return None
    tag = golden_tag(path)
    if not tag["release"] or tag["environment"] != "dev":
        return None
    version = tag["tag"].split("_", 1)[0]
    return version if version in RELEASE_IMAGES else None


def is_lts(record: dict) -> bool:
    """Whether the case ran in the CI's lts image (its golden file's name says so)."""
    golden = str((record.get("measured") or {}).get("golden_file") or "")
    return bool(golden) and golden_tag(golden)["environment"] == "lts"


def _container(record: dict) -> str | None:
    """The NGC container the case's CI image was built on (a collected record's own, else by date)."""
    known = (record.get("software") or {}).get("container")
    if known:
        return str(known)
    release = release_of(record)
    if release:
        return RELEASE_IMAGES[release][0]
    rows = LTS_CONTAINERS if is_lts(record) else DEV_CONTAINERS
    return _pinned(record, tuple((since, bump, c) for since, bump, c, _pytorch in rows))


def pytorch_of(record: dict) -> str | None:
    """The PyTorch release line of the container the case's memory values were recorded in (None: recorded
    before the first container listed, where the run file's default stands; no measured case is that old).
    A collected record names the container its commit's CI built on (``software.container``, read at that
    commit: a release branch's may differ from main's on the same date); a container :data:`DEV_CONTAINERS`
    or :data:`LTS_CONTAINERS` lists gives its PyTorch, any other falls back to the date."""
    known = {c: pytorch for rows in (DEV_CONTAINERS, LTS_CONTAINERS) for _since, _bump, c, pytorch in rows}
    container = _container(record)
    if container in known:
        return known[container]
    rows = LTS_CONTAINERS if is_lts(record) else DEV_CONTAINERS
    return _pinned(record, tuple((since, bump, pytorch) for since, bump, _c, pytorch in rows))


def megatron_of(record: dict) -> str | None:
    """The Megatron-Core version of the commit the case's memory values were recorded at (None: before
    2025-02-13, where the run file's default stands; no measured case is that old). A collected record
    carries its commit's own ``package_info.py`` version (``software.megatron_core``: exact on release
    branches too); a release golden (:func:`release_of`) its release; :data:`MC_VERSIONS` is main's history of that
    file."""
    return (record.get("software") or {}).get("megatron_core") or release_of(record) or _pinned(record, MC_VERSIONS)


def te_of(record: dict) -> str | None:
    """The Transformer Engine version the case ran (None: recorded before the first pin listed,
    2025-01-21, where the run file's default stands; no measured case is that old). By date on main's
    pins for collected records too (a release branch's own pin is not read); a case of the lts image by
    :data:`LTS_TE`; a release golden (:func:`release_of`) by its branch's image."""
    release = release_of(record)
    if release:
        return RELEASE_IMAGES[release][1]
    if not is_lts(record):
        return _pinned(record, TE_PINS)
    source = _pinned(record, LTS_TE)
    if source == "container":
        return NGC_TE.get(_container(record) or "")
    return _pinned(record, TE_PINS) if source == "dev" else source


#: Megatron-LM 5e4fc931ba "refactor(data): consolidate get_batch and enable PP for SFT THD" (2026-05-21, on
#: main at package_info 0.18.0, so no version gate separates it): ``pretrain_gpt.py: get_batch`` writes the
#: batch's ``.cuda()`` copies into the dict the rerun data iterator saved (``[framework] rerun_keeps_batch``)
KEEPS_BATCH = (("2026-05-21", "5e4fc931ba", "yes"),)


def keeps_batch_of(record: dict) -> bool:
    """Whether the case's recording commit has 5e4fc931ba's ``get_batch`` (:data:`KEEPS_BATCH`)."""
    return holds(record, KEEPS_BATCH)


#: Megatron-LM 2659630721 "perf(MoE): Memory efficient token permutation" (2025-04-09, on main at package_info
#: 0.12.0rc0, first released in core_v0.13.0rc0; no core_r0.12.x release has it): the routing probs scale the
#: experts' activation instead of the combine's experts' output (``[framework] moe_probs_in_experts``)
PROBS_IN_EXPERTS = (("2025-04-09", "2659630721", "yes"),)


def probs_in_experts_of(record: dict) -> bool:
    """Whether the case's recording commit has 2659630721 (:data:`PROBS_IN_EXPERTS`): Megatron-Core 0.13 and
    later, or main's 0.12.0rc0 from that commit on (a 0.12 release never)."""
    from timeline.profiles.megatron_workspaces import version_tuple

    mc = megatron_of(record) or "0.14.0"
    if version_tuple(mc) >= (0, 13):
        return True
    return mc == "0.12.0rc0" and holds(record, PROBS_IN_EXPERTS)


#: Megatron-LM c9dfe34798 "Enable NullTokenizer for pretraining to reduce I/O access" (2026-04-22, on main at
#: package_info 0.18.0, so no version gate on main separates it; first release core_v0.18.0): ``NullTokenizer``
#: reports ``--vocab-size`` itself, not one more (``timeline.io.megatron_tokenizer.null_adds_eod``)
NULL_VOCAB_EXACT = (("2026-04-22", "c9dfe34798", "yes"),)


def null_eod_of(record: dict) -> bool:
    """Whether the case's ``NullTokenizer`` counts its EOD on top of ``--vocab-size``: before c9dfe34798
    (:data:`NULL_VOCAB_EXACT`); a release's version decides (0.18.0 on, not), main's 0.18.0 its commit."""
    from timeline.profiles.megatron_workspaces import version_tuple

    version = version_tuple(megatron_of(record) or "0.14.0")
    if version < (0, 18):
        return True
    return version < (0, 19) and not holds(record, NULL_VOCAB_EXACT)


#: Megatron-LM a56a0b001d "fix(moe): ... reduce memory overhead for 1F1B A2A overlap" (2026-01-06, on main at
#: package_info 0.16.0rc0, so no version gate on main separates it; first release core_v0.16.0): combined 1F1B
#: releases each backward layer's schedule-plan nodes after the layer (``[framework]
#: combined_1f1b_keeps_node_io`` false from it on)
RELEASES_NODES = (("2026-01-06", "a56a0b001d", "yes"),)


def releases_nodes_of(record: dict) -> bool:
    """Whether the case's recording commit has a56a0b001d's node release (:data:`RELEASES_NODES`); a record
    of a release branch (its ``package_info`` a final release) by its version, 0.16.0 on."""
    from timeline.profiles.megatron_workspaces import version_tuple

    version = megatron_of(record) or ""
    if "rc" not in version and version_tuple(version) >= (0, 16, 0):
        return True
    return holds(record, RELEASES_NODES)


#: Megatron-LM d3528a2130 "fix(moe): fix TE general_gemm API change" (2026-03-06, on main at package_info
#: 0.16.0rc0; first released in core_v0.17.0): with TE ≥ 2.10 the MoE router's GEMM goes through TE's
#: ``general_gemm`` again (``[framework] router_te_gemm_fixed``; Megatron-Core ≥ 0.17 has it anyway). The dev
#: branch's package_info said 0.16.0rc0 long after it merged this (06ecac391e, 2026-04-08)
ROUTER_TE_GEMM = (("2026-03-06", "d3528a2130", "yes"),)

#: Megatron-LM af28b5a559 "[FSDP] Decouple Custom FSDP to make it independently installable" (2025-08-21, on main at
#: package_info 0.15.0rc0; cherry-picked to core_r0.14.0 as d774f1de6b, first released in core_v0.14.0rc7): the
#: ``megatron_fsdp`` package replaces ``custom_fsdp`` — prefetch and reduce-scatter budgets of 500M / 1B elements,
#: the step's ``start_param_sync`` prefetching, ``calc_params_l2_norm``'s ``stop_communication`` (``[framework]
#: megatron_fsdp_package``)
FSDP_PACKAGE = (("2025-08-21", "af28b5a559", "yes"),)

#: every rule gated on a Megatron-LM commit (``tools/megatron_gates.py`` lists where the date misleads)
#: the dev branch's 3b9c248a1b "Add experimental decoupled compact LayerWise DDP layout for Muon" (2026-06-30, not on
#: main: d98e8a64dd lacks it) made its compact layout the default there; a record descends from it or not (one of
#: :data:`GATES`: decided by ancestry through tools/megatron_gates.json, no Megatron-LM clone needed)
COMPACT_LAYOUT = (("2026-06-30", "3b9c248a1b", "yes"),)
GATES = (KEEPS_BATCH, PROBS_IN_EXPERTS, RELEASES_NODES, ROUTER_TE_GEMM, FSDP_PACKAGE, COMPACT_LAYOUT,
         NULL_VOCAB_EXACT)
GATES_FILE = ROOT / "tools" / "megatron_gates.json"


@functools.cache
def _gate_table() -> dict[str, dict]:
    return json.loads(GATES_FILE.read_text())["gates"] if GATES_FILE.exists() else {}


def holds(record: dict, history: tuple[tuple[str, str, str], ...], table: dict[str, dict] | None = None) -> bool:
    """Whether the case's recording commit holds the Megatron-LM commit of ``history`` (one of :data:`GATES`):
    from its ancestry where ``tools/megatron_gates.json`` lists the commit (main's and dev's commits whose date
    misleads, e.g. a dev commit dated after a main commit it has not merged yet), else by its date."""
    (_since, bump, _value), = history
    commit, _date = _recorded(record)
    listed = ((_gate_table() if table is None else table).get(bump) or {}).get("holds") or {}
    if commit[:10] in listed:
        return bool(listed[commit[:10]])
    return _pinned(record, history) == "yes"


def router_te_gemm_of(record: dict) -> bool:
    """Whether the case's recording commit has d3528a2130 (:data:`ROUTER_TE_GEMM`) though its Megatron-Core
    version is below 0.17 (where the version alone does not say it)."""
    from timeline.profiles.megatron_workspaces import version_tuple

    return version_tuple(megatron_of(record) or "0.14.0") < (0, 17) and holds(record, ROUTER_TE_GEMM)


def fsdp_package_of(record: dict) -> bool:
    """Whether the case's recording commit has af28b5a559's ``megatron_fsdp`` package (:data:`FSDP_PACKAGE`):
    Megatron-Core 0.14.0 and later releases and 0.16 on, never before 0.14; a 0.14.0rc or 0.15.0rc (main's and
    the release branch's both sides of it) by its commit."""
    from timeline.profiles.megatron_workspaces import version_tuple

    mc = megatron_of(record) or "0.14.0"
    version = version_tuple(mc)
    if version < (0, 14):
        return False
    if ("rc" not in mc and version >= (0, 14, 0)) or version >= (0, 16):
        return True
    return holds(record, FSDP_PACKAGE)


#: How Muon's layer-wise optimizer lays out its state on Megatron-LM's main from each commit on
#: (``timeline.io.megatron_optimizer``): the ping-pong deal over unsharded buffers until c1e938b039 "Integrate
#: LayerWiseDistributedOptimizer with DDP buffer infrastructure" (2026-05-13, package_info 0.18.0), which is not
#: modelled until 0044db1f20 "Route non-Muon params through DistributedOptimizer" (2026-05-21) gives the padded
#: layout core_v0.18.0 released
MUON_BUFFER_LAYOUT = (("2026-05-13", "c1e938b039", "integrated"), ("2026-05-21", "0044db1f20", "padded"))


def muon_buffer_layout_of(record: dict) -> str:
    """The layer-wise layout of the case's recording commit: ``compact`` where it descends from
    :data:`COMPACT_LAYOUT` (only a Muon case is asked), else by :data:`MUON_BUFFER_LAYOUT` (ping_pong before it)."""
    if "muon" in str((record.get("model_args") or {}).get("--optimizer", "")) and holds(record, COMPACT_LAYOUT):
        return "compact"
    return _pinned(record, MUON_BUFFER_LAYOUT) or "ping_pong"


PROVENANCE = ROOT / "tools" / "golden_provenance.json"


def load_provenance(path: Path = PROVENANCE) -> dict[str, dict]:
    """Case name → where its golden's bytes were first written (``tools/golden_provenance.py``)."""
    return json.loads(path.read_text())["cases"] if path.exists() else {}


def as_recorded(record: dict, provenance: dict[str, dict]) -> dict:
    """The record as its golden was recorded: where the golden's bytes are older than the dataset's
    ``memory_values_first_commit`` (a golden renamed with its test directory, not re-measured), the
    recording commit and date, and ``model_args`` / ``env`` with the recording directory's
    ``model_config.yaml`` differences applied (a value of None: the argument was absent then). A golden
    copied from another, still existing test (``kind`` "copied") is not this configuration's measurement
    at all (:func:`measurement_copies` leaves such cases out): the record stays as it is."""
    entry = provenance.get(record["name"])
    if not entry or not entry.get("recorded_earlier") or entry.get("kind") == "copied":
        return record
    out = dict(record)
    out["memory_values_first_commit"] = entry["recorded_commit"]
    out["memory_values_first_commit_date"] = entry["recorded_date"]
    for key in ("model_args", "env"):
        values = dict(record.get(key) or {})
        for name, (then, _now) in (entry.get(key) or {}).items():
            if then is None:
                values.pop(name, None)
            else:
                values[name] = then
        out[key] = values
    out["recorded_as"] = entry
    return out


def expressible(records: list[dict]) -> list[dict]:
    return [r for r in records if r.get("model_args") and not note_now(r)]


def _layout(record: dict) -> tuple:
    par = record["parallel"]
    return tuple(par.get(k) or 1 for k in ("tp", "pp", "vpp", "cp", "ep"))


def measurement_copies(records: list[dict]) -> dict[str, str]:
    """Cases whose measured memory cannot be of their own configuration: byte-identical (steady and peak
    allocated both) to another case's golden, current or previous, of a different parallel layout. Two
    layouts give different per-rank shapes, so identical bytes mean a golden file copied between test
    directories (as Megatron-LM's 22c69fa did, copying gpt3_15b_8t_release_sm's H100 golden of
    f57304256e into the new gpt3_15b_8t_release_sm_gb200). Case name → the case it copies."""
    seen: dict[tuple, list[dict]] = {}
    for r in records:
        prev = r.get("previous_memory_values") or {}
        if prev.get("alloc_last") and prev.get("max_last"):
            seen.setdefault((prev["alloc_last"][1], prev["max_last"][1]), []).append(r)
        m = r["measured"]
        seen.setdefault((m.get("allocated_bytes"), m.get("max_allocated_bytes_last_iter")), []).append(r)
    out = {}
    for r in records:
        m = r["measured"]
        key = (m.get("allocated_bytes"), m.get("max_allocated_bytes_last_iter"))
        if None in key:
            continue
        other = next((o for o in seen.get(key, []) if o is not r and _layout(o) != _layout(r)), None)
        if other is not None:
            out[r["name"]] = other["name"]
    return out


def gpu_of(record: dict) -> str:
    text = str(record["measured"].get("gpu", "H100"))
    return next((v for k, v in sorted(GPU_KINDS.items(), key=lambda kv: -len(kv[0])) if text.startswith(k)), "h100")


def family(record: dict) -> str:
    """dense | moe | bert | t5 | llava (Megatron's BertModel, T5Model and pretrain_vlm.py's LLaVAModel, reported
    apart), with "inferred world size" and "lts image" (the CI's lts container) where they hold."""
    model = record.get("model_family") or record.get("family_dir")
    moe = bool(record["model_args"].get("--num-experts"))
    kind = model if model in ("bert", "t5") else "llava" if model in VLM_FAMILIES else \
        "moe" if moe else "dense"
    tags = [tag for tag, on in (("inferred world size", bool(record["parallel"].get("world_size_inferred"))),
                                ("lts image", is_lts(record))) if on]
    return f"{kind}{' (' + ', '.join(tags) + ')' if tags else ''}"


def steady_after_first(tl: Timeline, d: int) -> int:
    """Allocated bytes of device ``d`` after iteration 1 (index 0) and its optimizer step: the blocks of
    the static state's and that iteration's events (each event belongs to the iteration of the action
    making it, so a step of no duration at the next iteration's first instant still counts)."""
    import numpy as np

    its = tl.event_iterations(d)
    blocks = tl.memory[d].block_bytes
    return int(np.sum(blocks[its <= 0], dtype=np.int64))


def peaks_through_second(tl: Timeline, d: int) -> tuple[int, int]:
    """(allocated, reserved) peaks of device ``d`` up to the end of the second reported iteration: what
    ``max_allocated_bytes_second_logged`` measured (``torch.cuda.max_memory_allocated``, never reset, logged by
    ``training_log()`` after the second iteration). A run simulated past it — the capture after
    ``--cuda-graph-warmup-steps`` and a replayed iteration (``from-megatron``'s ``training.iterations``) — has
    peaks the measurement had not seen yet; without later iterations this is ``tl.peak(d)``'s."""
    import numpy as np

    its = tl.event_iterations(d)
    first = tl.meta.warmup_iterations
    seen = (its < 0) | ((its >= first) & (its <= first + 1))
    allocated = np.cumsum(tl.memory[d].block_bytes)
    return int(allocated[seen].max()), int(tl.memory[d].reserved[seen].max())


def world_size_candidates(record: dict) -> list[int]:
    """The published world size; for an inferred one the dataset's choice, then its other candidates
    (``world_size_inference``) by the |residual| it ranked them with."""
    par = record["parallel"]
    if par.get("world_size") is None:  # a family the dataset inferred none for (bert/bert_release)
        from timeline.errors import UserError

        raise UserError("world size unknown: neither published by a CI recipe nor inferred")
    first = int(par["world_size"])
    if not par.get("world_size_inferred"):
        return [first]
    ranked = sorted(record.get("world_size_inference") or [], key=lambda c: abs(c["residual_bytes"]))
    return [first] + [int(c["world_size"]) for c in ranked if int(c["world_size"]) != first]


def convert_at_world_size(record: dict, margs: MegatronArgs) -> tuple[int, Conversion]:
    """(world size, conversion): the first candidate world size whose micro-batch count Megatron's
    schedule accepts — an inferred world size it would refuse cannot be the one the job ran on."""
    from timeline.io.megatron_write import UnschedulableJob, convert

    def at(world: int) -> Conversion:
        return convert(margs, world_size=world, gpu=gpu_of(record), pytorch_version=pytorch_of(record),
                       te_version=te_of(record), megatron_core=megatron_of(record), keeps_batch=keeps_batch_of(record),
                       probs_in_experts=probs_in_experts_of(record),
                       releases_nodes=releases_nodes_of(record), router_te_gemm_fixed=router_te_gemm_of(record),
                       fsdp_package=fsdp_package_of(record), resumed=resumed_run(record),
                       muon_buffer_layout=muon_buffer_layout_of(record), null_eod=null_eod_of(record))

    *earlier, last = world_size_candidates(record)
    for world in earlier:
        try:
            return world, at(world)
        except UnschedulableJob:
            continue
    return last, at(last)


def predict(record: dict) -> tuple[int, int, dict, int, int]:
    """(peak allocated, peak reserved, the reserved gap explained, allocated after iteration 1) of the
    last pipeline rank's device, and the world size simulated."""
    from timeline.io.megatron_args import from_mapping
    from timeline.io.megatron_write import run_file_text
    from timeline.io.runfile import run_from_data
    from timeline.result.build import build_timeline

    fam = record.get("family_dir", "")
    source = f"the path test_cases/{fam}/"
    if record.get("model_family"):  # a collected record: the training script its CI recipe ran
        fam, source = record["model_family"], f"the script {record.get('model_family_source')}"
    margs = from_mapping(record["model_args"], record.get("env"), family=fam, family_source=source)
    world, conv = convert_at_world_size(record, margs)
    name = record["name"].replace("/", "-")[-100:].lstrip("-_.")  # a run name holds at most 100 characters
    text = run_file_text(conv, name=name, source=record["config_file"], world_size=world)
    run = run_from_data(tomllib.loads(text), Path(f"<from-megatron>/{record['name']}.toml"))
    tl = build_timeline(run)
    last = max(range(tl.num_devices), key=lambda d: tl.devices[d].pp_rank)
    allocated, reserved = peaks_through_second(tl, last)
    from timeline.result.reserved_gap import reserved_gap

    return allocated, reserved, reserved_gap(tl, last, top=1), steady_after_first(tl, last), world


def validate(records: list[dict], only: str = "", failed: list | None = None,
             provenance: dict[str, dict] | None = None) -> list[dict]:
    """Rows per simulated case; cases that cannot be simulated go to ``failed`` as (name, message). Each
    case is simulated as recorded (:func:`as_recorded`, ``provenance`` defaulting to
    ``tools/golden_provenance.json``)."""
    from timeline.errors import UserError

    failed = [] if failed is None else failed
    copies = measurement_copies(records)
    provenance = load_provenance() if provenance is None else provenance
    rows = []
    for rec in expressible(records):
        if only and only not in rec["name"]:
            continue
        if not rec.get("source"):  # a collected record is its golden's recording already
            rec = as_recorded(rec, provenance)
        measured = int(rec["measured"]["max_allocated_bytes_second_logged"]["bytes"])
        try:
            alloc, reserved, gap, steady, world = predict(rec)
        except UserError as exc:
            failed.append((rec["name"], str(exc)))
            continue
        m = rec["measured"]
        # after the first iteration the job runs: iteration 1, or a resumed run's first after its checkpoint
        first = m.get("first_iter") == 1 or resumed_run(rec)
        steady_measured = (int(m["allocated_bytes_first_iter"])
                           if first and m.get("allocated_bytes_first_iter") is not None else None)
        rows.append({"name": rec["name"], "family": family(rec), "predicted": alloc, "measured": measured,
                     "error_pct": 100.0 * (alloc - measured) / measured, "reserved": reserved,
                     "reserved_gap": gap["by_last_occupant"], "pp": int(rec["parallel"].get("pp") or 1),
                     "steady_predicted": steady, "steady_measured": steady_measured, "world_size": world,
                     "dataset_world_size": int(rec["parallel"]["world_size"]),
                     "copy_of": copies.get(rec["name"]),
                     "recorded_at": rec["memory_values_first_commit"][:10] if rec.get("recorded_as") else None,
                     "record_id": rec.get("record_id", rec["name"]), "golden_tag": m.get("golden_tag"),
                     "date": rec.get("memory_values_first_commit_date")})
    return rows


def _memory_relevant(name: str) -> bool:
    """Whether ``from-megatron`` reads an argument or environment variable as moving memory: neither
    listed memory-neutral (``NEUTRAL_REASON``) nor an environment variable it leaves unmapped."""
    from timeline.io.megatron_table import ENV_MAPPED, NEUTRAL_REASON

    return name not in NEUTRAL_REASON if name.startswith("--") else name in ENV_MAPPED


def _same_tokenizer_file(name: str, values: list) -> bool:
    """A tokenizer file moved to another folder: from-megatron reads only its presence and file name
    (megatron_map.py: _vocab)."""
    if name not in ("--vocab-file", "--merge-file", "--tokenizer-model") or None in values:
        return False
    return len({str(v).rsplit("/", 1)[-1] for v in values}) == 1


def recorded_earlier_lines(rows: list[dict], provenance: dict[str, dict]) -> list[str]:
    """The cases simulated at their golden's recording commit rather than the dataset's."""
    out = []
    for r in rows:
        entry = provenance.get(r["name"])
        if not r.get("recorded_at") or not entry:
            continue
        moved = ", ".join(f"{k} {v[0]!r}→{v[1]!r}" for k, v in {**entry["model_args"], **entry["env"]}.items()
                          if _memory_relevant(k) and not _same_tokenizer_file(k, v))
        out.append(f"  {r['name']}: {entry['recorded_commit'][:10]} {entry['recorded_date']} "
                   f"({entry['kind']}: {entry['recorded_path'].rsplit('/', 2)[-2]}){'; then vs now: ' + moved if moved else ''}")
    return ["recorded earlier (golden bytes older than the dataset's commit; simulated at the recording commit "
            "with its model_config.yaml):"] + out if out else []


def case_lines(rows: list[dict], failed: list[tuple[str, str]], provenance: dict[str, dict], reserved: bool) -> list[str]:
    """A calibration part's per-case report: the table, world-size fallbacks, recordings, refusals."""
    out = [table(rows)]
    if reserved:
        out += gap_lines(rows)
    for r in rows:
        if r["world_size"] != r["dataset_world_size"]:
            out.append(f"world size: {r['name']}: the dataset's inferred {r['dataset_world_size']} gives a micro-batch "
                       f"count Megatron's schedule refuses; its next candidate, {r['world_size']}, is simulated")
    out += recorded_earlier_lines(rows, provenance)
    out += [f"not simulated: {name}: {message}" for name, message in failed]
    return out


def main() -> int:
    from measured_report import DEFAULT_CASES, SETS, load_cases, parts, summary

    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--data", default=str(DEFAULT_DATA))
    parser.add_argument("--set", default="shared", choices=SETS,
                        help="shared: the calibration dataset (default); calibration: it and the collected "
                             "calibration-side records; unseen: the collected unseen records (summary only); all")
    parser.add_argument("--cases", default=str(DEFAULT_CASES),
                        help="the collected records (tools/collect_megatron_cases.py --out)")
    parser.add_argument("--only", default="", help="cases whose name contains this")
    parser.add_argument("--json", help="write the calibration parts' rows as JSON here (never unseen rows)")
    parser.add_argument("--reserved", action="store_true",
                        help="also explain each case's reserved − allocated from the event stream")
    args = parser.parse_args()
    start = time.perf_counter()
    provenance = load_provenance()
    if not Path(args.data).exists():
        print(f"validate_measured: --data {args.data}: not found; give the calibration dataset "
              "(../shared/measured/megatron_calibration.json)", file=sys.stderr)
        return 2
    shared = json.loads(Path(args.data).read_text())
    cases = load_cases(Path(args.cases).expanduser()) if args.set != "shared" else []
    if isinstance(cases, str):
        print(f"validate_measured: {cases}", file=sys.stderr)
        return 2
    if any("recipe_commit" not in (r.get("parallel") or {}) for r in cases):
        print(f"validate_measured: --cases {args.cases}: collected before the lts image's versions and the recipes' "
              "history were read; rerun tools/collect_megatron_cases.py", file=sys.stderr)
    written: list[dict] = []
    summaries: list[str] = []
    count = 0
    for label, records, per_case in parts(args.set, shared, cases):
        # the kinds modelled now dropped from the notes (the data stays as collected)
        records = [{**r, "expressible_note": note_now(r), "resumed": resumed_run(r)} for r in records]
        failed: list[tuple[str, str]] = []
        rows = validate(records, args.only, failed, provenance)
        count += len(rows)
        if per_case:
            print(f"== {label} ==")
            print("\n".join(case_lines(rows, failed, provenance, args.reserved)))
            written += rows
        summaries += summary(label, [r for r in records if not args.only or args.only in r["name"]], rows, failed)
    if args.set in ("shared", "calibration"):
        summaries.append("== unseen: not run (--set unseen or all) ==")
    print("\n".join(summaries))
    print(f"wall time {time.perf_counter() - start:.1f} s for {count} cases")
    if args.json:
        Path(args.json).write_text(json.dumps(written, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
