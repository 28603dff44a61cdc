"""One measured Megatron-LM functional-test case as a record of ``megatron_calibration.json``'s schema.

The pieces ``tools/collect_megatron_cases.py`` puts together for each golden file at its recording
commit, each read from NVIDIA/Megatron-LM at that commit:

- ``measured``: the golden's ``mem-allocated-bytes`` / ``mem-max-allocated-bytes`` series, with the
  meanings of ``../shared/measured/README.md`` (``training_log()`` logs ``torch.cuda.memory_stats()``'s
  ``allocated_bytes.all.current`` / ``.peak`` on global rank ``world_size − 1`` after each logged
  iteration; the peak is never reset);
- the platform (GPU and container) from the golden file's name (``golden_values_{environment}_{platform}.json``);
- ``env``: the runner's defaults (``tests/functional_tests/shell_test_utils/_run_training.sh``:
  ``export NAME="${NAME:-value}"``) under the config's ``ENV_VARS``;
- the world size: ``nodes × gpus`` of the CI recipe (``tests/test_utils/recipes/**.yaml``; before 2024-12-03
  ``tests/functional_tests/jet_recipes/*.yaml``) whose ``spec.model`` is the family and whose products list the
  case in the golden's environment (dev | lts) on its platform (``tools/megatron_recipes.py`` picks it);
- ``expressible_note``: what the simulator cannot express today, by the configuration's own arguments
  (a ``_2nd`` golden is a resumed run's and a ``frozen-start`` test loads a checkpoint too, which
  ``validate_measured`` simulates: no note).

It does not decide which side of the split a case is on (``tools/megatron_split.py``) and writes nothing.
"""

from __future__ import annotations

import re
from typing import Any

import yaml

#: golden file platform token → (measured.gpu prefix, GPU kind) — Megatron-LM's CI platform names
PLATFORMS = (("gb200", "GB200"), ("b200", "B200"), ("h100", "H100"), ("a100", "A100"))
RUNNER = "tests/functional_tests/shell_test_utils/_run_training.sh"
#: where Megatron-LM's CI recipes live: tests/test_utils/recipes from 522e567ea3 (2024-12-03), which moved them
#: out of tests/functional_tests/jet_recipes
RECIPES = ("tests/test_utils/recipes", "tests/functional_tests/jet_recipes")
METRIC_SOURCE = ("torch.cuda.memory_stats(): allocated_bytes.all.current / allocated_bytes.all.peak, logged by "
                 "training_log() after optimizer step on rank world_size-1")


def golden_tag(path: str) -> dict[str, Any]:
    """What a golden file's name says: ``tag`` (after ``golden_values_``), ``environment`` (dev | lts),
    ``gpu`` (H100 | GB200 | A100 | B200 | None: the name has no platform), ``second`` (the ``_2nd`` golden
    of a resumed run), ``release`` (a Megatron-Core version in the name: a release-validation golden)."""
    leaf = path.rsplit("/", 1)[-1]
    tag = leaf[len("golden_values"):-len(".json")].lstrip("_")
    tokens = re.split(r"[_\-]", tag.lower())
    gpu = next((g for key, g in PLATFORMS if any(key in t for t in tokens)), None)
    return {"tag": tag, "environment": "lts" if "lts" in tokens else "dev", "gpu": gpu,
            "second": "2nd" in tokens, "release": bool(re.match(r"\d+\.\d+", tag))}


def series(golden: dict, key: str) -> list[tuple[int, float]]:
    """(iteration, value) of one metric of a golden, in order; values that are not numbers left out.
    Two layouts exist: ``values`` a mapping iteration → value, or a list from ``start_step`` every
    ``step_interval``."""
    entry = golden.get(key)
    if not isinstance(entry, dict):
        return []
    values = entry.get("values")
    if isinstance(values, dict):
        items = [(int(k), v) for k, v in values.items()]
    elif isinstance(values, list):
        start, step = int(entry.get("start_step", 1)), int(entry.get("step_interval", 1))
        items = [(start + i * step, v) for i, v in enumerate(values)]
    else:
        return []
    return sorted((i, float(v)) for i, v in items if isinstance(v, (int, float)) and v == v)


def measured(golden: dict) -> dict[str, Any] | None:
    """``measured`` as the calibration dataset defines it, or None when the golden logs no peak at two
    iterations or more (the comparison is with the high-water mark after the second logged one)."""
    peak = series(golden, "mem-max-allocated-bytes")
    if len(peak) < 2:
        return None
    alloc = series(golden, "mem-allocated-bytes")
    top = max(peak, key=lambda p: (p[1], -p[0]))  # the first iteration reaching the highest peak
    out: dict[str, Any] = {
        "first_iter": peak[0][0], "last_iter": peak[-1][0], "log_interval": peak[1][0] - peak[0][0],
        "n_logged": len(peak),
        "max_allocated_bytes_first_iter": int(peak[0][1]),
        "max_allocated_bytes_second_logged": {"iter": peak[1][0], "bytes": int(peak[1][1])},
        "max_allocated_bytes_last_iter": int(peak[-1][1]),
        "max_allocated_bytes_overall": {"iter": top[0], "bytes": int(top[1])},
        "rank": "last pp rank (global rank world_size-1)", "metric_source": METRIC_SOURCE}
    if alloc:
        out.update({"allocated_bytes": int(alloc[-1][1]), "allocated_bytes_first_iter": int(alloc[0][1]),
                    "allocated_bytes_range": [int(min(v for _, v in alloc)), int(max(v for _, v in alloc))]})
    return out


def runner_env(script: str | None) -> dict[str, str]:
    """The defaults ``_run_training.sh`` exports (``export NAME="${NAME:-value}"``)."""
    found = re.findall(r'^\s*export\s+([A-Z0-9_]+)="\$\{\1:-([^}]*)\}"', script or "", re.M)
    return {name: value for name, value in found if value}


def env_text(value: object) -> str:
    """An ``ENV_VARS`` value as the shell exports it."""
    if isinstance(value, bool):
        return "true" if value else "false"
    return str(value)


def merged_config(base: dict, model: dict, runtime: dict) -> dict:
    """Megatron-LM's ``tests/test_utils/python_scripts/merge_config.py`` (moe2.0, 2025-12): per top-level
    key, mappings updated base → model → runtime, lists concatenated without repeats, scalars the last set."""
    out: dict = {}
    for key in set(base) | set(model) | set(runtime):
        vals = [base.get(key), model.get(key), runtime.get(key)]
        first = next((v for v in vals if v), None)
        if isinstance(first, dict):
            out[key] = {}
            for v in vals:
                out[key].update(v or {})
        elif isinstance(first, list):
            out[key] = list(dict.fromkeys(item for v in vals for item in (v or [])))
        else:
            out[key] = next((v for v in reversed(vals) if v is not None), None)
    return out


def _listed(value: Any) -> list:
    return value if isinstance(value, list) else [value]


def recipe_worlds(recipe_texts: dict[str, str]) -> dict[tuple[str, str], list[dict[str, Any]]]:
    """(family, test case) → every recipe product listing it: ``gpu`` (kind, or None), ``environments`` (the
    CI images it runs in, dev | lts; None: any), ``nodes``, ``gpus`` (per node; a product's values override
    the spec's), ``path``, the moe2.0 ``model_config`` / ``runtime_config`` it merges, and the training
    ``script`` (``TRAINING_SCRIPT_PATH``) with the model family its name gives (``pretrain_gpt.py`` → gpt).
    Two layouts: each ``products`` entry a test-case group with its own ``products`` list (from 2024-12), or
    (the jet_recipes of 2024) a product whose ``test_case`` list names the cases it runs."""
    out: dict[tuple[str, str], list[dict[str, Any]]] = {}
    for path, text in sorted(recipe_texts.items()):
        try:
            data = yaml.safe_load(text)
        except yaml.YAMLError:
            continue
        spec = data.get("spec") if isinstance(data, dict) else None
        if not isinstance(spec, dict) or not spec.get("model"):
            continue
        script = re.search(r"TRAINING_SCRIPT_PATH=(\S*?pretrain_(\w+)\.py)", str(spec.get("script", "")))
        for group in data.get("products") or []:
            if not isinstance(group, dict):
                continue
            for product in group.get("products") or [group]:
                product = product if isinstance(product, dict) else {}
                environments = _listed(product.get("environment", spec.get("environment")))
                entry = {"nodes": int(_listed(product.get("nodes", spec.get("nodes", 1)))[0]),
                         "gpus": int(_listed(product.get("gpus", spec.get("gpus", 8)))[0]), "path": path,
                         "model_config": _listed(product.get("model_config"))[0],
                         "runtime_config": _listed(product.get("runtime_config"))[0],
                         "script": script.group(1) if script else None,
                         "script_family": script.group(2) if script else None,
                         "environments": None if environments == [None] else [str(e) for e in environments]}
                for platform in _listed(product.get("platforms", spec.get("platforms"))):
                    gpu = golden_tag(f"golden_values_{platform}.json")["gpu"] if platform else None
                    for case in _listed(group.get("test_case")):
                        out.setdefault((str(spec["model"]), str(case)), []).append({**entry, "gpu": gpu})
    return out


def _on(args: dict, name: str) -> bool:
    value = args.get(name)
    return value not in (None, False, "false", "False", "none", "None", 0)


def expressible_note(family: str, config: dict | None, tag: dict[str, Any]) -> str | None:
    """What the simulator cannot express in this configuration (None: nothing known), one reason per
    kind, joined by "; " — the calibration dataset's categories."""
    if config is None:
        return "no model_config.yaml at the recording commit"
    args = config.get("MODEL_ARGS") or {}
    test_type, mode = config.get("TEST_TYPE"), config.get("MODE")
    notes = []
    if any(k.startswith("MODEL_ARGS_") or k == "BASE_MODEL_ARGS" for k in config):
        notes.append("multiple runs in one test (MODEL_ARGS_N)")
    family_notes = {"bert": "BERT encoder model", "t5": "T5 encoder-decoder model",
                    "multimodal-llava": "multimodal model", "mimo": "multimodal model"}
    if family in family_notes:
        notes.append(family_notes[family])
    if family == "hybrid" or any(_on(args, k) for k in ("--hybrid-layer-pattern", "--hybrid-override-pattern",
                                                         "--is-hybrid-model", "--mamba-num-heads")):
        notes.append("Mamba/hybrid model")
    if _on(args, "--flextron"):
        notes.append("Flextron elastic model")
    if mode == "inference" or (mode is None and any(k.startswith("--inference-") for k in args)
                               and test_type == "frozen-start"):
        notes.append("inference test (no training step)")
    if mode == "rl" or any(k.startswith(("--langrl-", "--rl-", "--grpo-")) for k in args):
        notes.append("RL/GRPO loop (inference engine + training in one process)")
    if any(_on(args, k) for k in ("--fp8-format", "--fp8", "--fp4-format", "--fp4")):
        notes.append("fp8/fp4 training")
    if _on(args, "--enable-cuda-graph") or _on(args, "--external-cuda-graph") or (
            str(args.get("--cuda-graph-impl", "none")) not in ("none", "None")):
        notes.append("CUDA graphs (graph memory pools)")
    if any(_on(args, k) for k in ("--fine-grained-activation-offloading", *OTHER_OFFLOADS)):
        notes.append(OFFLOADING)
    if _on(args, "--use-megatron-fsdp") or _on(args, "--use-torch-fsdp2") or (
            args.get("--data-parallel-sharding-strategy") in ("optim_grads", "optim_grads_params")):
        notes.append("FSDP / ZeRO-3 style sharding")
    optimizer = args.get("--optimizer")
    if optimizer not in (None, "adam"):
        notes.append(f"optimizer {optimizer} (not Adam)")
    if _on(args, "--export-kd-teacher-load"):
        notes.append("ModelOpt distillation (teacher model in memory)")
    if test_type == "checkpoint-consistency" and "inference test (no training step)" not in notes:
        notes.append(f"TEST_TYPE {test_type}: loads a checkpoint before the measured iterations")
    if tag["release"]:
        notes.append("release-validation golden (a Megatron-Core version in its name, not recorded at this commit)")
    return "; ".join(dict.fromkeys(notes)) or None


#: expressible-note kinds the data wrote that the simulator models now, and how: the ``_2nd`` golden of a
#: ``ckpt-resume`` test is its second run, which loads the first run's checkpoint (the optimizer's state with
#: it) before its first logged iteration, and a ``frozen-start`` test loads the frozen checkpoint of the data
#: folder before its first (``tests/functional_tests/shell_test_utils/run_ci_test.sh``: RUN_NUMBER=2 with
#: CHECKPOINT_LOAD_PATH the first run's save; frozen-start's CHECKPOINT_LOAD_PATH); both are simulated as
#: loading it (``from-megatron --resumed``: the optimizer's state unless --finetune / --no-load-optim,
#: ``timeline/sim/megatron_load.py``)
#: the CUDA-graph kind: modelled for TE's per-layer graphs of the whole layer or its attention
#: (timeline/sim/graph_capture.py), narrowed by :func:`note_now` to what stays refused
CUDA_GRAPHS = "CUDA graphs (graph memory pools)"
#: the offloading kind, which Megatron's fine-grained activation offloading alone no longer earns: it is modelled
#: (timeline/graph/offload.py, timeline/sim/offload.py); the other offloads keep it
OFFLOADING = "offloading to CPU"
#: the offloads besides the fine-grained activation offloading that still earn :data:`OFFLOADING`
OTHER_OFFLOADS = ("--cpu-offloading", "--optimizer-cpu-offload", "--offload-optimizer-states")
#: the note of every multimodal test (LLaVA's pretrain_vlm.py and MIMO's examples/mimo/train.py alike)
MULTIMODAL = "multimodal model"
MODELLED_NOTES = ("BERT encoder model",  # Megatron-Core's BertModel (pretrain_bert.py) is modelled:
                  # timeline/graph/families/bert.py, timeline/io/megatron_bert.py (the legacy BertModel, TE's fused
                  # or flash attention under its padding mask, context parallelism refused)
                  "T5 encoder-decoder model",  # Megatron-Core's T5Model (pretrain_t5.py) is modelled on one
                  # pipeline stage: timeline/graph/families/t5.py, timeline/io/megatron_t5.py
                  "Mamba/hybrid model",  # hybrid Mamba models (pretrain_mamba.py's MambaModel) are modelled:
                  # timeline/graph/families/mamba.py, timeline/io/megatron_hybrid.py (context parallelism refused)
                  "fp8/fp4 training",  # FP8 (delayed, tensorwise) is modelled; from-megatron refuses FP4 and the
                  # other FP8 recipes by name (timeline/io/megatron_map.py: fp8_training)
                  "the _2nd golden of a resumed run: loads a checkpoint before the measured iterations",
                  # --optimizer muon / dist_muon / sgd: timeline/graph/optim_state.py (from-megatron refuses the
                  # layer-wise optimizer in the DDP buffers, Megatron-LM from c1e938b039, by its own reason)
                  "optimizer muon (not Adam)", "optimizer dist_muon (not Adam)", "optimizer sgd (not Adam)",
                  "TEST_TYPE frozen-start: loads a checkpoint before the measured iterations",
                  "TEST_TYPE frozen-start: loads a checkpoint before the measured iterations (peak may reflect "
                  "loading)")


#: Megatron-LM d677041da2 (2025-04-08): from it on the custom FSDP's units are the decoder layers alone (before, the
#: legacy Float16Module hid share_embeddings_and_output_weights and LanguageModelEmbedding was a unit too)
FSDP_UNITS_FROM = "2025-04-08"


def fsdp_note(record: dict, kind: str) -> str | None:
    """What stays unmodelled of an "FSDP / ZeRO-3 style sharding" note (None: Megatron-FSDP as
    ``timeline.sim.megatron_fsdp`` models it): torch FSDP2, Megatron-FSDP recorded before d677041da2, or under FP8."""
    args = record.get("model_args") or {}
    if _on(args, "--use-torch-fsdp2"):
        return "torch FSDP2 (not modelled)"
    if not (_on(args, "--use-megatron-fsdp") or _on(args, "--use-custom-fsdp")):
        # --data-parallel-sharding-strategy alone: DistributedDataParallelConfig stores it and only Megatron-FSDP
        # reads it (arguments.py: validate_args checks it under --use-megatron-fsdp; pretrain_gpt.py and
        # pretrain_hybrid.py build DDP through training.py: pretrain), so the job is DDP (d98e8a64dd)
        return None
    date = str(record.get("memory_values_first_commit_date") or record.get("commit_date") or "")
    if date < FSDP_UNITS_FROM:
        return "custom FSDP before d677041da2 (its embedding an FSDP unit: not modelled)"
    if _on(args, "--delay-wgrad-compute"):  # refused by from-megatron for DDP and FSDP alike
        return "Megatron-FSDP with --delay-wgrad-compute (delayed weight gradients: not modelled)"
    if "fp8/fp4 training" in str(record.get("expressible_note") or ""):
        return "Megatron-FSDP under FP8 (its FP8 parameter groups and transpose caches: not modelled)"
    return None


def note_now(record: dict) -> str | None:
    """The record's expressible note without the kinds :data:`MODELLED_NOTES` lists (None: nothing left); a CUDA
    graphs kind narrowed to what from-megatron does not model (:func:`cuda_graph_note`), FSDP to what stays
    unmodelled (:func:`fsdp_note`)."""
    from timeline.io.megatron_table import VLM_FAMILIES

    kinds = [k for k in str(record.get("expressible_note") or "").split("; ") if k and k not in MODELLED_NOTES]
    if MULTIMODAL in kinds and (record.get("model_family") or record.get("family_dir")) in VLM_FAMILIES:
        kinds.remove(MULTIMODAL)  # pretrain_vlm.py's LLaVA is modelled (graph/families/llava.py); MIMO is not
    if CUDA_GRAPHS in kinds:
        narrowed = cuda_graph_note(record.get("model_args") or {})
        kinds = [narrowed if k == CUDA_GRAPHS else k for k in kinds if k != CUDA_GRAPHS or narrowed]
    kinds = [fsdp_note(record, k) if k.startswith("FSDP / ZeRO-3") else k for k in kinds]
    args = record.get("model_args") or {}
    if _on(args, "--fine-grained-activation-offloading") and not any(_on(args, k) for k in OTHER_OFFLOADS):
        kinds = [k for k in kinds if k not in (OFFLOADING, "activation " + OFFLOADING)]  # the collection's, the dataset's
    return "; ".join(k for k in kinds if k) or None


def cuda_graph_note(args: dict) -> str | None:
    """None where from-megatron models the arguments' CUDA graphs (TE's per-layer graphs of the whole layer or
    its attention: ``timeline/io/megatron_framework.py: cuda_graph_scope``), else the kind it refuses."""
    from timeline.errors import UserError
    from timeline.io.megatron_framework import cuda_graph_scope
    from timeline.io.megatron_map import ArgReader

    try:
        cuda_graph_scope(ArgReader(dict(args)))
    except UserError as exc:
        return f"CUDA graphs not modelled: {str(exc).split(':')[0]}"
    return None


def resumed_run(record: dict) -> bool:
    """Whether the job loads a checkpoint before its measured iterations: a resumed run's golden
    (``golden_values_…_2nd.json``) or a ``frozen-start`` test's (by ``test_type``, or the data's note)."""
    if "resumed" in record:  # decided before the note was rewritten (main)
        return bool(record["resumed"])
    return (str(record["measured"].get("golden_tag") or "").endswith("_2nd") or record.get("test_type") == "frozen-start"
            or "TEST_TYPE frozen-start" in str(record.get("expressible_note") or ""))


def package_version(text: str | None) -> str | None:
    """Megatron-Core's version from ``megatron/core/package_info.py``."""
    if not text:
        return None
    parts = dict(re.findall(r"^(MAJOR|MINOR|PATCH|PRE_RELEASE)\s*=\s*['\"]?([\w.]*)['\"]?", text, re.M))
    if not {"MAJOR", "MINOR", "PATCH"} <= set(parts):
        return None
    return f"{parts['MAJOR']}.{parts['MINOR']}.{parts['PATCH']}{parts.get('PRE_RELEASE', '')}"


def container(environment: str, ngc_version: str | None, *build_ymls: str | None) -> str | None:
    """The NGC PyTorch container (``YY.MM``) the CI image of ``environment`` builds on: ``docker/.ngc_version.<env>``
    (from 2025-11), else the ``BASE_IMAGE`` of ``CI_MCORE_<ENV>_IMAGE`` in the build stage's image matrix
    (``build_ymls``: ``.gitlab/stages/01.build.yml`` from 2025-03-19, ``.gitlab/stages/01.test.yml`` before)."""
    for text in (ngc_version, *build_ymls):
        if not text:
            continue
        if text is not ngc_version:
            block = re.search(rf"IMAGE:\s*CI_MCORE_{environment.upper()}_IMAGE(?:(?!IMAGE:\s*CI_).)*", text, re.S)
            text = block.group(0) if block else ""
        found = re.search(r"nvcr\.io/nvidia/pytorch:(\d+\.\d+)", text)
        if found:
            return found.group(1)
    return None


def layout(args: dict) -> dict[str, Any]:
    """The parallel sizes ``validate_measured`` reads off a record (Megatron's defaults where absent)."""
    def size(*names: str, default: int | None = 1) -> int | None:
        for n in names:
            if args.get(n) not in (None, False):
                try:
                    return int(args[n])
                except (TypeError, ValueError):
                    return default
        return default

    tp = size("--tensor-model-parallel-size")
    return {"tp": tp, "pp": size("--pipeline-model-parallel-size"), "cp": size("--context-parallel-size"),
            "ep": size("--expert-model-parallel-size"),
            "etp": size("--expert-tensor-parallel-size", default=tp),
            "vpp": size("--num-virtual-stages-per-pipeline-rank", default=None)}
