"""Load a serving run file (``[serving]``, DESIGN §12): the same TOML format, reader and
``--set`` overrides as a training run, with ``[serving]`` (and ``[serving.load]`` or
``serving.requests``) in place of ``[training]`` / ``[recompute]`` / ``[schedule]``.

Every problem is collected and raised as one :class:`~timeline.errors.SpecError` naming the
file and each key, like :func:`timeline.io.runfile.load_run`.
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from dataclasses import replace
from pathlib import Path
from typing import Any

from timeline.errors import SpecError, UserError
from timeline.io.hf_quant import read_quantization
from timeline.io.hf_vision import is_vision_language, split_vision
from timeline.io.requests_csv import read_requests
from timeline.io.runfile import NAME_RE, _resolve_model, default_name, parse_override, read_toml, world_of
from timeline.spec.engine_versions import (
    SGLANG_MAX_PREFILL_TOKENS,
    USAGE_CONTEXTS,
    VLLM_DEFAULT,
    VLLM_MODELOPT_KV_FP8,
    is_v1,
    release_at_least,
    sglang_server_defaults,
    version_problem,
    vllm_runs_v1,
    vllm_scheduler_defaults,
    vllm_subtracts_cudagraph_estimate,
    vllm_v1_fallback,
)
from timeline.spec.fields import build_section
from timeline.spec.hardware import NVIDIA_SMI_TOTAL_MIB, TORCH_TOTAL_GIB, fill_gpu
from timeline.spec.model import ModelSpec
from timeline.spec.quant import CheckpointQuant
from timeline.spec.run import AllocatorSpec, HardwareSpec, ParallelSpec
from timeline.spec.serve_validate import serve_problems
from timeline.spec.serving import ENGINE_VERSIONS, DistSpec, LoadSpec, ServeRunSpec, ServingSpec
from timeline.spec.vision import VisionSpec

SECTIONS = ("model", "parallel", "hardware", "allocator", "serving")
TRAINING_ONLY = ("training", "recompute", "schedule")


def is_serving_file(data: dict[str, Any]) -> bool:
    return "serving" in data


def _load(values: dict[str, Any], problems: list[tuple[str, str]]) -> LoadSpec | None:
    values = dict(values)
    dists: dict[str, DistSpec] = {}
    before = len(problems)
    for key in ("prompt_tokens", "output_tokens"):
        if key in values:
            raw = values.pop(key)
            if not isinstance(raw, dict):
                problems.append((f"serving.load.{key}", 'expected a table such as {dist = "fixed", value = 512}'))
                continue
            d = build_section(DistSpec, f"serving.load.{key}", raw, problems)
            if d is not None:
                dists[key] = d
    spec = build_section(LoadSpec, "serving.load", values, problems)
    if spec is None or len(problems) > before:
        return None
    return replace(spec, **dists)


def _checkpoint_config(model_data: Any, base: Path) -> dict[str, Any] | None:
    """The hf_config's JSON object (None without one, or unreadable: the model reader reports that)."""
    if not isinstance(model_data, dict) or not isinstance(model_data.get("hf_config"), str):
        return None
    try:
        cfg = json.loads((base / model_data["hf_config"]).read_text())
    except (OSError, ValueError):
        return None
    return cfg if isinstance(cfg, dict) else None


def _quant_file(model_data: Any, base: Path) -> dict[str, Any] | None:
    """ModelOpt's ``hf_quant_config.json`` beside the hf_config (ModelOpt ≤ 0.29 writes its quantization there;
    vLLM reads it when ``config.json`` has no ``quantization_config``: ``transformers_utils/config.py``
    ``get_config``), or None."""
    if not isinstance(model_data, dict) or not isinstance(model_data.get("hf_config"), str):
        return None
    path = (base / model_data["hf_config"]).parent / "hf_quant_config.json"
    try:
        data = json.loads(path.read_text()) if path.is_file() else None
    except (OSError, ValueError):
        return None
    return data if isinstance(data, dict) else None


def _checkpoint_vision(cfg: dict[str, Any] | None) -> VisionSpec | None:
    """The checkpoint's vision tower (:func:`timeline.io.hf_vision.split_vision`), None for a language model (the
    model was read already, so a vision-language config here is a modelled one)."""
    return split_vision(cfg)[1] if cfg is not None and is_vision_language(cfg) else None


def _checkpoint_quant(cfg: dict[str, Any] | None, sv: dict[str, Any], problems: list[tuple[str, str]],
                      notes: list[str], quant_file: dict[str, Any] | None = None) -> CheckpointQuant | None:
    """The checkpoint's ``quantization_config`` (:func:`timeline.io.hf_quant.read_quantization`); it sets
    ``serving.weight_dtype`` / ``quant_group_size``, and a run-file value that contradicts it is a problem.
    A ModelOpt checkpoint whose KV cache is fp8 makes ``kv_cache_dtype`` left unset fp8_e4m3 from vLLM 0.14
    (:data:`~timeline.spec.engine_versions.VLLM_MODELOPT_KV_FP8`)."""
    if cfg is None:
        return None
    try:
        quant = read_quantization(cfg, quant_file)
    except UserError as exc:
        problems.append(("model.hf_config", str(exc)))
        return None
    if quant is None:
        return None
    for key, value in (("weight_dtype", quant.weight_dtype), ("quant_group_size", quant.run_group_size)):
        if key in sv and sv[key] != value:
            problems.append((f"serving.{key}", f"{sv[key]!r} contradicts the checkpoint's quantization_config "
                             f"({quant.source}: {value!r}); remove it"))
        sv[key] = value
    if sv.get("engine") == "sglang" and quant.method in ("modelopt", "auto-round", "bitsandbytes"):
        notes.append(f"{quant.source}: the weights are laid out as vLLM loads them (SGLang's loader for this method "
                     "is not read)")
    version = sv.get("engine_version")
    if quant.kv_fp8 and sv.get("engine", "vllm") == "vllm" and sv.get("kv_cache_dtype", "auto") == "auto" \
            and (not isinstance(version, str) or not version or release_at_least(version, VLLM_MODELOPT_KV_FP8)):
        sv["kv_cache_dtype"] = "fp8_e4m3"
        notes.append("the ModelOpt checkpoint's KV cache is fp8 (kv_cache_quant_algo): vLLM 0.14+ resolves "
                     "--kv-cache-dtype auto to fp8_e4m3 (utils/torch_utils.py resolve_kv_cache_dtype_string)")
    return quant


def _engine_v1(sv: dict[str, Any], sm: int, pp: Any, model: ModelSpec, quant: CheckpointQuant | None) -> tuple[bool,
                                                                                                           list[str]]:
    """(V1?, notes) of a vLLM run file's values before they are checked: ``serving.engine_v1`` where set, else the
    version's engine unless vLLM's oracle falls back (:func:`timeline.spec.engine_versions.vllm_v1_fallback`), which
    a note says (values of the wrong type read as their defaults: the checks after name them)."""
    version = sv.get("engine_version")
    version = version if isinstance(version, str) else ""

    def text(key: str, default: str) -> str:
        value = sv.get(key, default)
        return value if isinstance(value, str) else default

    features = {"sm": sm, "kv_cache_dtype": text("kv_cache_dtype", "auto"), "dtype": text("dtype", "bf16"),
                "pp": pp if isinstance(pp, int) and not isinstance(pp, bool) else 1,
                "speculative": text("speculative_method", ""), "mla": model.is_mla,
                "quant_method": quant.method if quant is not None else ""}
    mode = text("engine_v1", "auto")
    v1 = vllm_runs_v1(version, mode, **features)
    feature, experimental = vllm_v1_fallback(version, **features)  # type: ignore[arg-type]
    if mode != "auto" or not feature or not is_v1(version):
        return v1, []
    said = (f"'{feature} is experimental on VLLM_USE_V1=1. Falling back to V0 Engine.'" if experimental else
            f"'{feature} is not supported by the V1 Engine. Falling back to V0.'")
    return v1, [f"vLLM {version} runs its V0 engine for this job, as its oracle decides (engine/arg_utils.py "
                f"EngineArgs._is_v1_supported_oracle; its log: {said}): V0's scheduler defaults, profile run and "
                "budget; serving.engine_v1 = \"on\" is VLLM_USE_V1=1" + ("" if experimental else
                                                                          ", which that vLLM refuses here")]


def _version_defaults(sv: dict[str, Any], max_position: int, device_gib: float, gpu: str,
                      v1: bool | None = None, model: ModelSpec | None = None, multimodal: bool = False) -> list[str]:
    """Fill the scheduler knobs a vLLM run file leaves out with the engine's defaults at the named
    ``serving.engine_version`` (:func:`timeline.spec.engine_versions.vllm_scheduler_defaults`); a run
    without a version keeps the spec's defaults. Returns the notes to print."""
    version = sv.get("engine_version")
    if sv.get("engine", "vllm") != "vllm" or not isinstance(version, str) or version_problem("vllm", version):
        return []
    mml = sv.get("max_model_len") or max_position
    if not isinstance(mml, int):
        return []
    notes = []
    chunked = sv.get("enable_chunked_prefill")
    usage = sv.get("usage_context", "openai_api_server")
    d = vllm_scheduler_defaults(version, mml, device_gib, gpu, chunked if isinstance(chunked, bool) else None,
                                usage if usage in USAGE_CONTEXTS else "openai_api_server", v1=v1,
                                mla=bool(model and model.is_mla), multimodal=multimodal,
                                sliding=bool(model and any(model.is_sliding(i) for i in range(model.num_hidden_layers))),
                                speculative=bool(sv.get("speculative_method")))
    if chunked is False and d.enable_chunked_prefill:  # a V1 release that turns chunked prefill on regardless
        sv["enable_chunked_prefill"] = True
        notes.append(f"vLLM {version} runs chunked prefill whatever enable_chunked_prefill says (its V1 "
                     "_set_default_args sets it for every generative model before 0.11.1): read as true")
    sv.setdefault("enable_chunked_prefill", d.enable_chunked_prefill)
    sv.setdefault("max_num_seqs", d.max_num_seqs)
    sv.setdefault("max_num_batched_tokens", d.max_num_batched_tokens)
    return notes


def _sglang_defaults(sv: dict[str, Any], gpu: str, tp: Any, pp: Any, dp: Any, model: Any, cfg: dict | None,
                     model_path: str) -> None:
    """SGLang's own defaults where the run file leaves them out, at the named ``serving.engine_version``
    (:func:`timeline.spec.engine_versions.sglang_server_defaults`; needs the GPU's nvidia-smi total): the
    ``chunked_prefill_size`` and decode ``cuda_graph_max_bs`` of the GPU's band and ``mem_fraction_static``
    from them; pages of one token (``--page-size`` 1); ``max_num_seqs`` 0, SGLang's ``max_running_requests``
    derived from its pool by the serve layer (:func:`timeline.serve.budget.with_engine_requests`)."""
    if sv.get("engine") != "sglang":
        return
    sv.setdefault("block_size", 1)
    reqs = sv.get("max_num_seqs")
    given_reqs = reqs if isinstance(reqs, int) and not isinstance(reqs, bool) else 0
    sv.setdefault("max_num_seqs", 0)
    version = sv.get("engine_version") or ENGINE_VERSIONS["sglang"][0]
    if not isinstance(version, str) or version_problem("sglang", version):
        return
    if gpu not in NVIDIA_SMI_TOTAL_MIB or not isinstance(tp, int) or not isinstance(pp, int):
        return

    def given(key: str) -> int:
        value = sv.get(key)
        return value if isinstance(value, int) and not isinstance(value, bool) else 0

    # --chunked-prefill-size ≤ 0 (enable_chunked_prefill false): a prefill batch holds --max-prefill-tokens
    chunk_off = sv.get("enable_chunked_prefill") is False
    prefill = given("max_prefill_tokens") or SGLANG_MAX_PREFILL_TOKENS
    try:
        d = sglang_server_defaults(
            version, NVIDIA_SMI_TOTAL_MIB[gpu], tp, pp, mla=bool(model.is_mla),
            architectures=tuple(str(a) for a in (cfg or {}).get("architectures") or ()), model_path=model_path,
            chunked_prefill_size=-1 if chunk_off else given("max_num_batched_tokens"),
            max_prefill_tokens=prefill,
            cuda_graph_max_bs=given("cuda_graph_max_bs"),
            disable_cuda_graph=sv.get("enforce_eager") is True, prefill_cuda_graph=str(sv.get("prefill_cuda_graph", "auto")),
            max_running_requests=given_reqs, max_total_tokens=given("max_total_tokens"),
            context_length=given("max_model_len"), multimodal=False, dp_attention=sv.get("enable_dp_attention") is True,
            dp_size=dp if isinstance(dp, int) and not isinstance(dp, bool) and dp > 0 else 1, dsa=bool(model.index_n_heads))
    except ValueError:  # a combination SGLang refuses (dp ∤ tp under DP attention): the validation names it
        return
    sv.setdefault("max_num_batched_tokens", prefill if chunk_off else d.chunked_prefill_size)
    sv.setdefault("cuda_graph_max_bs", d.cuda_graph_max_bs)
    sv.setdefault("mem_fraction_static", d.mem_fraction_static)


def load_serve_run(path: str | Path, overrides: Sequence[str] = (),
                   data: dict[str, Any] | None = None) -> ServeRunSpec:
    """Read, override, resolve and validate a serving run file."""
    path = Path(path)
    data = read_toml(path) if data is None else data
    source = str(path)
    problems: list[tuple[str, str]] = []
    try:
        for text in overrides:
            section, key, value = parse_override(text)
            target = data.setdefault(section, {})
            if not isinstance(target, dict):
                problems.append((f"--set {section}", "is not a section"))
                continue
            if key.startswith("load.") and section == "serving":  # --set serving.load.seed=3
                target = target.setdefault("load", {})
                key = key.removeprefix("load.")
            target[key] = value
    except SpecError as exc:
        raise exc.with_source(source) from None
    for key, value in data.items():
        if key == "name":
            continue
        if key in TRAINING_ONLY:
            problems.append((key, "a serving run file ([serving]) has no [training], [recompute] or [schedule]; "
                             "remove it, or remove [serving] and use `timeline simulate`"))
        elif key not in SECTIONS:
            problems.append((key, f"unknown section; valid: {', '.join(SECTIONS)}"))
        elif not isinstance(value, dict):
            problems.append((key, "must be a [section] table"))
    base = path.resolve().parent
    notes: list[str] = []
    model, model_source = None, ""
    if not isinstance(data.get("model"), dict):
        problems.append(("model", 'missing [model] section; e.g. preset = "llama3-8b"'))
    else:
        model_data = dict(data["model"])
        if "profile" in model_data:
            problems.append(("model.profile", "a serving run has no training profile; remove it"))
            model_data.pop("profile")
        if "trace" in model_data:
            problems.append(("model.trace", "serving reads preset or hf_config models; a captured trace "
                             "is a training step"))
        else:
            model_notes: list[str] = []
            model, _, model_source = _resolve_model(model_data, base, problems, None, model_notes, vision=True)
            # the training reader's note on an ignored quantization_config: serving reads it (_checkpoint_quant)
            notes += [n for n in model_notes if "is ignored: training memory" not in n]

    def table(name: str) -> dict[str, Any]:
        v = data.get(name, {})
        return dict(v) if isinstance(v, dict) else {}

    par_values = table("parallel")
    par_values.setdefault("sp", False)  # inference engines do not shard the sequence
    tp = par_values.get("tp", 1)
    if isinstance(tp, int) and not isinstance(tp, bool):
        par_values.setdefault("etp", tp)
    parallel = build_section(ParallelSpec, "parallel", par_values, problems)
    hw_values = table("hardware")
    gpu = hw_values.get("gpu", "h100")
    hw_values.setdefault("gpu", gpu)
    # an engine budgets from the total PyTorch reports, not the data sheet's (timeline.spec.hardware)
    if isinstance(gpu, str) and gpu in TORCH_TOTAL_GIB:
        hw_values.setdefault("capacity_gib", TORCH_TOTAL_GIB[gpu])
    found = fill_gpu(hw_values, world_of(par_values))
    problems += found
    hardware = None if found else build_section(HardwareSpec, "hardware", hw_values, problems)
    allocator = build_section(AllocatorSpec, "allocator", table("allocator"), problems)
    sv_values = table("serving")
    if sv_values.get("engine", "vllm") == "vllm" and sv_values.get("engine_version") in (None, ""):
        # a run that names no vLLM is the run of the default rule set, every version-dependent rule alike
        # (scheduler defaults included): VLLM_DEFAULT, said in a note
        sv_values["engine_version"] = VLLM_DEFAULT
        notes.append(f"serving.engine_version is not given: read as vLLM {VLLM_DEFAULT}, the newest release the "
                     "rules are read at; give yours (`vllm --version`), e.g. --set serving.engine_version=0.11.0")
    load_values = sv_values.pop("load", None)
    cfg = _checkpoint_config(data.get("model"), base)
    quant = _checkpoint_quant(cfg, sv_values, problems, notes, _quant_file(data.get("model"), base))
    vision = _checkpoint_vision(cfg) if model is not None else None
    if quant is not None and quant.method == "bitsandbytes" and model is not None and model.is_moe:
        notes.append("bitsandbytes MoE: vLLM dequantizes every local expert to the model dtype on each forward "
                     "(bitsandbytes.py BitsAndBytesMoEMethod.apply), a transient of 2 bytes a parameter the profile "
                     "run holds; it is not modelled, so the activation peak here is low by that much")
    if model is not None and hardware is not None:
        v1 = None
        if sv_values.get("engine", "vllm") == "vllm":
            v1, v1_notes = _engine_v1(sv_values, hardware.sm, parallel.pp if parallel is not None else 1, model, quant)
            notes += v1_notes
        notes += _version_defaults(sv_values, model.max_position_embeddings, hardware.capacity_gib, str(gpu), v1,
                                   model, vision is not None)
        if model.has_linear_attention:
            # vLLM turns prefix caching off by default for hybrid models (config/model.py
            # ModelConfig.is_prefix_caching_supported: attn_type "hybrid"); asked for, it runs the states "align"
            sv_values.setdefault("enable_prefix_caching", False)
        _sglang_defaults(sv_values, str(gpu), par_values.get("tp", 1), par_values.get("pp", 1),
                         par_values.get("dp", 1), model, cfg,
                         f"{model.name} {(data.get('model') or {}).get('hf_config', '')}")
    serving = build_section(ServingSpec, "serving", sv_values, problems)
    if serving is not None and serving.engine == "vllm" and serving.cuda_graph_estimate_gib is None \
            and vllm_subtracts_cudagraph_estimate(serving.engine_version) and not serving.enforce_eager \
            and serving.cudagraph_mode != "none":
        notes.append(f"vLLM {serving.engine_version} subtracts its CUDA-graph memory estimate from the KV budget "
                     "(the default from 0.20.0; its log prints 'Estimated CUDA graph memory: X GiB total'), which is "
                     "not modelled: the KV pool here is larger by that much; give serving.cuda_graph_estimate_gib = X "
                     "(0 for VLLM_MEMORY_PROFILER_ESTIMATE_CUDAGRAPHS=0)")
    load = None
    if load_values is not None:
        if not isinstance(load_values, dict):
            problems.append(("serving.load", "must be a [serving.load] table"))
        else:
            load = _load(load_values, problems)
    requests: tuple = ()
    if serving is not None:
        if serving.requests and load_values is not None:
            problems.append(("serving.requests", "give either requests = \"trace.csv\" or [serving.load], not both"))
        elif not serving.requests and load_values is None:
            problems.append(("serving", 'give requests = "trace.csv" or a [serving.load] table'))
        elif serving.requests:
            try:
                requests = read_requests((base / serving.requests).resolve())
            except UserError as exc:
                problems.append(("serving.requests", str(exc)))
    name = data.get("name", default_name(path))
    if not isinstance(name, str) or not NAME_RE.fullmatch(name):
        problems.append(("name", f"{name!r} is not a run name: use letters, digits, '.', '_' and '-', "
                         "starting with a letter or digit, at most 100 characters"))
    if problems:
        raise SpecError(problems, source)
    assert model is not None and hardware is not None  # a missing one is one of the problems above
    run = ServeRunSpec(name=name, source=str(path.resolve()), model=model, model_source=model_source,
                       parallel=parallel, hardware=hardware, allocator=allocator, serving=serving, load=load,
                       requests=requests, notes=tuple(notes), quant=quant, vision=vision)
    problems = serve_problems(run)
    if problems:
        raise SpecError(problems, source)
    return run
