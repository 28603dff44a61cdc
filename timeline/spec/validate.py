"""Run-level validation: every rule that spans sections, all problems at once.

Returns (key path, message) pairs; the reader adds the file name. A message says what is
wrong *and* what would be valid, e.g. ``parallel.tp: 3 does not divide num_attention_heads=128;
use one of 1, 2, 4, 8, 16, 32, 64, 128``. A profile's limits (how far ZeRO goes, one device per
replica) come from the caller (``timeline.profiles.LIMITS``): this layer knows no profile.
"""

from __future__ import annotations

import dataclasses
import math
import re
from collections.abc import Mapping
from typing import Protocol

from timeline.spec.arch_rules import architecture_problems, architecture_run_problems
from timeline.spec.cp_rules import cp_comm_problems
from timeline.spec.cuda_graph_rules import cuda_graph_problems
from timeline.spec.engine_versions import parse_version
from timeline.spec.fp8_rules import fp8_problems
from timeline.spec.framework import FrameworkSpec
from timeline.spec.legacy_rules import legacy_problems
from timeline.spec.model import ModelSpec
from timeline.spec.mtp_rules import mtp_stage_problems
from timeline.spec.run import OffloadSpec, ParallelSpec, RecomputeSpec, RunSpec, ScheduleSpec, TrainingSpec
from timeline.spec.schedule_rules import schedule_problems

#: ``[parallel]`` keys a single-device profile requires to be 1
MODEL_PARALLEL_KEYS = ("pp", "tp", "ep", "cp")


class ProfileLimits(Protocol):
    """What validation reads of a profile's limits (:class:`timeline.profiles.base.Limits`)."""

    @property
    def max_zero(self) -> int: ...
    @property
    def zero_note(self) -> str: ...
    @property
    def single_device(self) -> bool: ...
    @property
    def instead(self) -> str: ...
    @property
    def sinks_cp_note(self) -> str: ...
    @property
    def squared_relu(self) -> bool: ...
    @property
    def reads_framework(self) -> bool: ...
    @property
    def framework_keys(self) -> tuple[str, ...]: ...
    @property
    def shared_experts_tp_split(self) -> bool: ...


def _divisors(n: int, limit: int = 12) -> str:
    ds = [d for d in range(1, n + 1) if n % d == 0]
    return ", ".join(map(str, ds[:limit])) + (", …" if len(ds) > limit else "")


def suggest_layout(layers: int, chunks: int) -> list[int]:
    """An even-as-possible split, larger chunks first (Megatron rejects uneven splits)."""
    base, extra = divmod(layers, chunks)
    return [base + (1 if i < extra else 0) for i in range(chunks)]


def model_problems(m: ModelSpec) -> list[tuple[str, str]]:
    """Contradictions inside the architecture that the modelling code itself would reject."""
    problems: list[tuple[str, str]] = []
    add = problems.append
    if not m.head_dim and m.hidden_size % m.num_attention_heads:
        add(("model.num_attention_heads", f"{m.num_attention_heads} does not divide hidden_size={m.hidden_size}; "
             "give head_dim explicitly or a head count that divides it"))
    if not m.is_mla and m.kv_heads > m.num_attention_heads:  # MLA has no key/value heads of its own
        add(("model.num_key_value_heads", f"{m.kv_heads} exceeds num_attention_heads={m.num_attention_heads}; "
             "grouped-query attention shares each key/value head among several query heads"))
    if m.is_mla and not (m.qk_rope_head_dim and m.qk_nope_head_dim and m.v_head_dim):
        add(("model.kv_lora_rank", "multi-head latent attention (kv_lora_rank > 0) needs qk_rope_head_dim, "
             "qk_nope_head_dim and v_head_dim, each ≥ 1"))
    if m.is_moe:
        if not 1 <= m.num_experts_per_tok <= m.n_routed_experts:
            add(("model.num_experts_per_tok", f"{m.num_experts_per_tok} is not in 1…n_routed_experts="
                 f"{m.n_routed_experts}: each token is routed to at least one and at most every expert"))
        if not m.moe_intermediate_size:
            add(("model.moe_intermediate_size", "a mixture-of-experts model (n_routed_experts > 0) needs "
                 "moe_intermediate_size ≥ 1, the width of one expert"))
    if m.layer_types and len(m.layer_types) != m.num_hidden_layers:
        add(("model.layer_types", f"{len(m.layer_types)} entries for num_hidden_layers={m.num_hidden_layers}; "
             "give one attention kind per decoder layer (or set both together)"))
    if "sliding_attention" in m.layer_types and not m.sliding_window:
        add(("model.sliding_window", "layer_types names sliding_attention layers; give sliding_window ≥ 1"))
    problems += hybrid_problems(m)
    problems += architecture_problems(m)
    if m.mlp_layer_types and len(m.mlp_layer_types) != m.num_hidden_layers:
        add(("model.mlp_layer_types", f"{len(m.mlp_layer_types)} entries for num_hidden_layers={m.num_hidden_layers}; "
             "give one (dense or moe) per decoder layer"))
    if m.mlp_layer_types and (m.first_k_dense_replace or m.moe_layer_freq != 1):
        add(("model.mlp_layer_types", "given with first_k_dense_replace / moe_layer_freq: give one or the other"))
    if m.first_k_dense_replace > m.num_hidden_layers:
        add(("model.first_k_dense_replace", f"{m.first_k_dense_replace} exceeds num_hidden_layers="
             f"{m.num_hidden_layers}; use at most {m.num_hidden_layers} (all dense)"))
    return problems


def hybrid_problems(m: ModelSpec) -> list[tuple[str, str]]:
    """A hybrid pattern as Megatron-Core's ``mamba_hybrid_layer_allocation.py: _allocate_override`` checks it
    (length and symbols), and the Mamba mixer's own assertions (``mamba_mixer.py: MambaMixer.__init__``)."""
    if not m.is_hybrid:
        return []
    key = "model.hybrid_override_pattern"
    out: list[tuple[str, str]] = []
    pattern = m.hybrid_override_pattern
    if len(pattern) != m.num_hidden_layers:
        out.append((key, f"{len(pattern)} layers for num_hidden_layers={m.num_hidden_layers}; give one symbol per "
                         "decoder layer"))
    bad = sorted(set(pattern) - set("M*-E"))
    if bad:
        out.append((key, f"{''.join(bad)!r} is not a layer symbol; use M (Mamba), * (attention), - (MLP), E (MoE)"))
    if "E" in pattern and not m.is_moe:
        out.append((key, "E (MoE) layers need n_routed_experts ≥ 1"))
    # an MTP depth past the pattern is an attention layer then the model's MLP or MoE (ModelSpec.layer_kind "T"):
    # Megatron's '*E' / '*-' MTP patterns (timeline.io.megatron_hybrid.MTP_PATTERNS)
    if m.mamba_heads % m.n_groups:
        out.append(("model.n_groups", f"{m.n_groups} does not divide mamba heads {m.mamba_heads}"))
    return out


def chunk_sizes(par: ParallelSpec, num_layers: int) -> list[int]:
    """Decoder layers per virtual stage: the layout, or the even split validate_run requires."""
    chunks = par.pp * par.vpp
    if par.layout is not None:
        return list(par.layout)
    return suggest_layout(num_layers, chunks)


def recompute_problems(rc: RecomputeSpec, par: ParallelSpec, num_layers: int) -> list[tuple[str, str]]:
    """Full recompute's ``num_layers`` against the chunks it applies to."""
    if rc.policy != "full":
        return []
    nums = rc.num_layers if isinstance(rc.num_layers, tuple) else (rc.num_layers,)
    problems: list[tuple[str, str]] = []
    if rc.method == "uniform" and any(n == 0 for n in nums):
        problems.append(("recompute.num_layers", 'method = "uniform" checkpoints groups of num_layers layers; '
                         'give 1 or more (method = "block" takes 0 for a rank that recomputes nothing)'))
    most = max(chunk_sizes(par, num_layers), default=0)
    if any(n > most for n in nums):
        problems.append(("recompute.num_layers", f"{max(nums)} exceeds the {most} decoder layers of the largest "
                         f"virtual stage; use 1…{most}"))
    return problems


#: the first Megatron-Core release whose attention runs tp above the KV groups (attention.py, core_v0.16.0)
TP_ABOVE_KV_GROUPS = (0, 16, 0)


def tp_above_kv_groups(profile: str, m: ModelSpec, par: ParallelSpec, fw: FrameworkSpec) -> bool:
    """Whether tensor parallelism exceeds the KV groups the way Megatron-Core 0.16 on runs it: the megatron
    profile, tp a multiple of the groups, not MLA (``Attention.__init__``: one KV group per rank)."""
    if profile != "megatron" or m.is_mla or not m.kv_heads or par.tp <= m.kv_heads or par.tp % m.kv_heads:
        return False
    version = parse_version(fw.megatron_core or "")
    return version is not None and version >= TP_ABOVE_KV_GROUPS


def validate_run(run: RunSpec, limits: Mapping[str, ProfileLimits]) -> list[tuple[str, str]]:
    """Every problem of ``run``; ``limits``: every profile's limits by name
    (``timeline.profiles.LIMITS``). A door (``tests/test_layering.py``): validation reads a whole run."""
    before, after = validate_all_but_recompute(run, limits)
    if run.recompute.distribute_saved and (run.profile != "megatron" or run.trace is not None):
        after = [*after, ("recompute.distribute_saved", 'is Megatron-LM\'s, modelled with profile = "megatron" '
                          "(no captured trace) only; remove it")]
    return before + run_recompute_problems(run.recompute, run.parallel, run.model, before) + after + \
        offload_problems(run.offload, run.model, run.framework, run.recompute, run.schedule, profile=run.profile,
                         traced=run.trace is not None)


def offload_problems(off: OffloadSpec, m: ModelSpec, fw: FrameworkSpec, rc: RecomputeSpec, sched: ScheduleSpec, *,
                     profile: str, traced: bool) -> list[tuple[str, str]]:
    """``[offload]`` against the rest of a run (``traced``: its model a captured trace): what Megatron-LM itself refuses
    (``transformer_config.py: TransformerConfig.__post_init__``, ``arguments.py: validate_args``) and what the
    model of it (:mod:`timeline.graph.offload`, :mod:`timeline.sim.offload`) does not cover."""
    if not off.modules:
        return []
    problems: list[tuple[str, str]] = []
    add = problems.append
    key = "offload.modules"
    if profile != "megatron" or traced:
        add((key, 'fine-grained activation offloading is Megatron-LM\'s: it needs profile = "megatron" and a model '
             "the layer library builds; remove [offload]"))
        return problems
    if m.architecture != "gpt" or m.is_hybrid:
        add((key, f"offloading is modelled for Megatron-LM's GPTModel, whose forward starts each chunk's offload "
             f"handler (gpt_model.py: preprocess_for_fine_grained_offloading); {m.name} is not one: remove [offload]"))
    if "attn_proj" in off.modules and "core_attn" not in off.modules:
        add((key, '"attn_proj" without "core_attn": Megatron-LM refuses it (the output projection\'s input is the '
             "core attention's output, which core attention's backward needs); add core_attn"))
    if fw.transformer_impl != "transformer_engine":
        add((key, 'Megatron-LM offloads activations only with transformer_impl = "transformer_engine" '
             "(arguments.py: validate_args)"))
    if rc.policy == "full":
        add((key, "full recompute runs each layer without saving anything in its forward; offloading under it "
             "is not modelled: use selective recompute or remove [offload]"))
    if sched.kind not in ("1f1b", "interleaved"):
        add((key, f"schedule {sched.kind!r} is not one of Megatron-LM's: its offload manager orders the chunks as "
             'its 1F1B and interleaved schedules run them; set schedule.kind = "1f1b" or "interleaved"'))
    if fw.delay_wgrad_compute:
        add((key, "deferred weight gradients (delay_wgrad_compute) with offloading are not modelled"))
    if fw.cuda_graph_impl != "none":
        add((key, "CUDA graphs with offloading (--delay-offload-until-cuda-graph) are not modelled"))
    return problems


def validate_all_but_recompute(run: RunSpec, limits: Mapping[str, ProfileLimits]) -> tuple[
        list[tuple[str, str]], list[tuple[str, str]]]:
    """:func:`validate_run`'s problems before and after its recompute section
    (:func:`run_recompute_problems`), the only one that reads ``run.recompute``: a planner checks
    one layout once for all its recompute policies."""
    profiles = tuple(limits)
    m, par, tr = run.model, run.parallel, run.training
    problems: list[tuple[str, str]] = model_problems(m)
    add = problems.append

    # -- tensor parallelism ------------------------------------------------------------
    if m.num_attention_heads % par.tp:
        add(("parallel.tp", f"{par.tp} does not divide num_attention_heads={m.num_attention_heads}; "
             f"use one of {_divisors(m.num_attention_heads)}"))
    elif not m.is_mla and m.kv_heads % par.tp and not tp_above_kv_groups(run.profile, m, par, run.framework):
        # Megatron-LM core_v0.16.0 … core_v0.19.0 transformer/attention.py: Attention.__init__ — with
        # num_query_groups < tp each rank computes one KV group and num_heads / num_query_groups q heads, then
        # keeps its num_heads / tp (graph/families/attention.py: attend)
        more = ("; Megatron-Core from 0.16 runs tp above the KV groups (attention.py: one KV group per rank): "
                "give [framework] megatron_core = \"0.16.0\" or later") \
            if run.profile == "megatron" and par.tp % m.kv_heads == 0 else ""
        add(("parallel.tp", f"{par.tp} does not divide num_key_value_heads={m.kv_heads}; "
             f"use one of {_divisors(m.kv_heads)}{more}"))
    if not m.is_mla and m.kv_heads <= m.num_attention_heads and m.num_attention_heads % m.kv_heads:
        add(("model.num_key_value_heads", f"{m.kv_heads} does not divide num_attention_heads="
             f"{m.num_attention_heads}"))
    if m.intermediate_size % par.tp and not all(m.is_moe_layer(i) for i in range(m.num_hidden_layers)):
        add(("parallel.tp", f"{par.tp} does not divide intermediate_size={m.intermediate_size}"))
    if m.is_hybrid and "M" in m.hybrid_override_pattern:
        if m.mamba_heads % par.tp or m.n_groups % par.tp:  # mamba_mixer.py: MambaMixer.__init__ asserts
            add(("parallel.tp", f"{par.tp} does not divide the Mamba heads ({m.mamba_heads}) and groups "
                 f"({m.n_groups}); use one of {_divisors(math.gcd(m.mamba_heads, m.n_groups))}"))
        if par.cp > 1 and (m.n_groups // par.tp) % par.cp:  # MambaContextParallel: group_repeat_count > 1
            add(("parallel.cp", f"{par.cp} does not divide the Mamba groups per TP rank ({m.n_groups}/{par.tp}): "
                 "the repeated B/C groups are not modelled; use a cp that divides them"))
        if run.profile != "megatron":
            add(("model.profile", "a hybrid Mamba model is modelled as Megatron-Core runs it; use profile = "
                 '"megatron"'))
    if run.sp_enabled and tr.seq_len % par.tp:
        add(("training.seq_len", f"{tr.seq_len} is not divisible by tp={par.tp}, which sequence "
             "parallelism needs; use a multiple of tp or set parallel.sp = false"))
    if par.cp > 1 and tr.seq_len % (2 * par.cp):
        add(("training.seq_len", f"{tr.seq_len} is not divisible by 2·cp={2 * par.cp} (context "
             "parallelism cuts the sequence into 2·cp chunks)"))

    # -- experts --------------------------------------------------------------------------
    if not m.is_moe:
        if par.ep > 1:
            add(("parallel.ep", f"ep={par.ep} needs a mixture-of-experts model; {m.name} is dense; set ep = 1"))
        if tr.capacity_factor > 0:
            add(("training.capacity_factor", "applies to mixture-of-experts models only; set it to 0"))
    else:
        if m.n_routed_experts % par.ep:
            add(("parallel.ep", f"{par.ep} does not divide n_routed_experts={m.n_routed_experts}; "
                 f"use one of {_divisors(m.n_routed_experts)}"))
        stage_world = par.dp * par.tp * par.cp
        if stage_world % (par.ep * par.etp):
            add(("parallel.ep", f"ep·etp = {par.ep}·{par.etp} does not divide dp·tp·cp = {stage_world}; "
                 "expert parallelism folds into the data-, tensor- and context-parallel ranks"))
        if m.moe_intermediate_size % par.etp:
            add(("parallel.etp", f"{par.etp} does not divide moe_intermediate_size={m.moe_intermediate_size}"))
        lim = limits.get(run.profile)
        if m.shared_ffn % par.tp and lim is not None and lim.shared_experts_tp_split:
            # the shared experts' fc1 / fc2 are column- / row-parallel over tp (moe/shared_experts.py: SharedExpertMLP
            # builds an MLP of the layer's TP group), as the profile's parameter rule says
            add(("parallel.tp", f"{par.tp} does not divide the shared experts' intermediate size {m.shared_ffn} "
                 f"(model.shared_expert_intermediate_size, or n_shared_experts × moe_intermediate_size); use one of "
                 f"{_divisors(m.shared_ffn)}"))
    if tr.routing == "skew" and tr.routing_skew > 2.0:
        add(("training.routing_skew", f"{tr.routing_skew} > 2: the EP loads ramp linearly from the busiest "
             "rank's routing_skew down to 2 − routing_skew (mean 1), so it must be in [1, 2]"))
    if tr.routing == "balanced" and tr.routing_skew != 1.0:
        add(("training.routing_skew", 'applies with routing = "skew"; set routing = "skew" or remove it'))

    # -- pipeline layout ------------------------------------------------------------------
    kind = run.schedule.kind
    problems += schedule_problems(kind, pp=par.pp, vpp=par.vpp, num_microbatches=tr.num_microbatches,
                                  microbatch_group_size=run.schedule.microbatch_group_size,
                                  combined_1f1b=run.schedule.combined_1f1b)
    chunks = par.pp * par.vpp
    layers = m.num_hidden_layers
    if par.layout is not None:
        if len(par.layout) != chunks:
            add(("parallel.layout", f"has {len(par.layout)} entries; it needs one per virtual stage, "
                 f"pp·vpp = {chunks}"))
        elif sum(par.layout) != layers:
            add(("parallel.layout", f"sums to {sum(par.layout)} layers; the model has {layers}"))
    elif layers % chunks:
        add(("parallel.layout", f"{layers} layers do not divide into pp·vpp = {chunks} virtual stages; "
             f"give a layout, e.g. layout = {suggest_layout(layers, chunks)}"))

    # -- profiles and ZeRO -------------------------------------------------------------------
    life = limits.get(run.profile)
    if not any(k == "parallel.layout" for k, _ in problems):
        problems += mtp_stage_problems(par, chunk_sizes(par, layers), mtp_layers=m.mtp_layers, schedule_kind=kind,
                                       framework=run.framework, reads_framework=life is not None and life.reads_framework)
    if life is None:
        add(("model.profile", f"{run.profile!r} is not valid; use one of {', '.join(profiles)}"))
    elif tr.zero > life.max_zero:
        add(("training.zero", f"zero = {tr.zero} is not available with profile = \"{run.profile}\" "
             f"({life.zero_note}); use zero = {' or '.join(map(str, range(life.max_zero + 1)))}, or "
             f"profile = \"{life.instead}\""))
    if run.framework.fsdp_sharding and tr.zero != 1:
        # Megatron-LM d98e8a64dd arguments.py: validate_args — Megatron-FSDP v1 sets --use-distributed-optimizer
        add(("framework.fsdp_sharding", "Megatron-FSDP runs its parameter groups under the distributed optimizer; "
             "set training.zero = 1"))
    if run.framework.fsdp_sharding and (tr.optimizer == "muon" or tr.precision_aware):
        # arguments.py: validate_args rejects Muon under Megatron-FSDP (693587db5a on); TE's FusedAdam holding the
        # masters of its shards is not modelled (timeline.sim.megatron_fsdp keeps them in its main-weight buffers)
        add(("framework.fsdp_sharding", "Megatron-FSDP is modelled with Adam or SGD and fp32 masters of its own; "
             "use optimizer = \"adam\" or \"sgd\" without precision_aware, or drop fsdp_sharding"))
    problems += optimizer_problems(tr, run.profile, traced=run.trace is not None)
    if life is not None and life.single_device:
        for key in MODEL_PARALLEL_KEYS:
            if getattr(par, key) > 1:
                add((f"parallel.{key}", f'profile = "{run.profile}" models one device per model replica; '
                     f'{key} > 1 needs profile = "{life.instead}"'))
    if life is not None and life.sinks_cp_note and m.attention_sinks and par.cp > 1:
        add(("parallel.cp", f'attention with learned sinks (GPT-OSS) under profile = "{run.profile}": '
             f"{life.sinks_cp_note}; set cp = 1"))

    before = problems
    problems = []
    add = problems.append

    # -- schedule ---------------------------------------------------------------------------
    if kind == "csv" and not run.schedule.csv:
        add(("schedule.csv", 'kind = "csv" needs csv = "path/to/schedule.csv"'))
    if kind != "csv" and run.schedule.csv:
        add(("schedule.csv", f'is only read with kind = "csv" (kind is "{kind}")'))

    # -- allocator --------------------------------------------------------------------------
    al = run.allocator
    if al.max_split_size_mb and al.max_split_size_mb <= 20:
        add(("allocator.max_split_size_mb", f"must be > 20 (PyTorch's rule) or 0 for unlimited, "
             f"got {al.max_split_size_mb}"))
    rpd = al.roundup_power2_divisions
    values = [v for _, v in rpd] if isinstance(rpd, tuple) else [rpd]
    for v in values:
        if not isinstance(v, int) or v < 0 or (v > 1 and v & (v - 1)):
            add(("allocator.roundup_power2_divisions", f"{v!r} must be 0 or a power of two"))
    if isinstance(rpd, tuple):
        for k, _ in rpd:
            key = k.upper().removesuffix("MB")
            if key != ">" and not (key.isdigit() and int(key) & (int(key) - 1) == 0):
                add(("allocator.roundup_power2_divisions", f"key {k!r} must be a power of two in MB "
                     '(e.g. "1MB", "256MB") or ">"'))

    if (par.dp * par.cp) % tr.optimizer_instances:
        add(("training.optimizer_instances", f"{tr.optimizer_instances} does not divide dp·cp = {par.dp * par.cp}"))

    if m.hidden_act == "relu2" and not (life is not None and life.squared_relu):
        add(("model.hidden_act", '"relu2" (squared ReLU) is modelled by the megatron and hf profiles only'))

    if m.parallel_residual and run.profile == "hf":
        # transformers models/phi/modeling_phi.py PhiAttention.forward: RoPE on the first partial_rotary_factor of
        # each head (query_rot / query_pass), then torch.cat back — tensors the hf profile's rope rule has not read
        add(("profile", "Phi's partial-rotary attention (PhiAttention's rot/pass split and torch.cat) is not "
             'modelled by the hf profile; use profile = "megatron", or serve the model (timeline serve)'))

    # -- framework (read by the megatron profile only) ----------------------------------------
    for key in ("pytorch", "transformer_engine"):
        text = getattr(run.framework, key)
        if not re.fullmatch(r"\d+\.\d+(\.\d+)?([a-z+.].*)?", text):
            add((f"framework.{key}", f"{text!r} is not a version; write X.Y or X.Y.Z (e.g. \"2.13\")"))
    fw = run.framework
    if m.is_moe and fw.moe_token_dispatcher == "flex" and life is not None and life.reads_framework:
        # MC transformer/moe/token_dispatcher.py: MoEFlexTokenDispatcher asserts tp_size·ep_size > 1;
        # transformer_config.py refuses moe_pad_expert_input_to_capacity with the deepep backend
        if par.ep * par.etp < 2:
            add(("framework.moe_token_dispatcher", '"flex" needs ep·etp > 1 (MoEFlexTokenDispatcher); use '
                 '"alltoall" or raise parallel.ep'))
        if fw.moe_flex_backend == "deepep" and tr.pad_to_capacity:
            add(("training.pad_to_capacity", 'the flex dispatcher\'s deepep backend does not pad to capacity; '
                 'set moe_flex_backend = "hybridep" or pad_to_capacity = false'))
    if tr.moe_router_padding and m.is_moe:  # MC transformer_config.py: __post_init__ (4e85d74ae9)
        if tr.fp8_recipe == "none":
            add(("training.moe_router_padding", "pads to the FP8 GEMMs' alignment, which Megatron-LM refuses without "
                 "FP8 training; set training.fp8_recipe or drop it"))
        if fw.moe_token_dispatcher == "allgather" and life is not None and life.reads_framework:
            add(("training.moe_router_padding", "the allgather dispatcher does not pad (Megatron-LM refuses it); use "
                 "the alltoall or flex dispatcher or drop it"))
    if m.moe_latent_size:  # MC transformer/moe/moe_layer.py (b51db3e07a on); arguments.py: validate_args
        if not m.is_moe:
            add(("model.moe_latent_size", "latent projections wrap routed experts: set n_routed_experts > 0 or 0 here"))
        if run.profile != "megatron" or run.trace is not None:
            add(("model.moe_latent_size", 'models Megatron-Core\'s latent MoE (moe_layer.py: fc1/fc2_latent_proj); set '
                 'model.profile = "megatron"'))
        if fw.moe_legacy_grouped_gemm:
            add(("framework.moe_legacy_grouped_gemm", "Megatron-LM refuses MoE latent projections with the legacy "
                 "grouped GEMM (arguments.py: validate_args); set it false"))
    for key in ("combined_1f1b_keeps_node_io", "ep_overlap_early_attn_memory_release"):
        if getattr(fw, key) and not run.schedule.combined_1f1b:
            add((f"framework.{key}", "applies to combined 1F1B only; set schedule.combined_1f1b = true or remove it"))
    if fw.delay_wgrad_compute:  # MC transformer_config.py: __post_init__ (core_v0.14.0 … 4e85d74ae9)
        if not run.schedule.combined_1f1b:
            add(("framework.delay_wgrad_compute", "Megatron-LM needs --overlap-moe-expert-parallel-comm with it: set "
                 "schedule.combined_1f1b = true or remove it"))
        if fw.moe_legacy_grouped_gemm:
            add(("framework.delay_wgrad_compute", "Megatron-LM refuses it with the legacy grouped GEMM; set "
                 "framework.moe_legacy_grouped_gemm = false or remove it"))
        te = parse_version(fw.transformer_engine)
        if fw.cuda_graph_impl == "transformer_engine" and te is not None and te < (2, 10, 0):
            add(("framework.delay_wgrad_compute", "Megatron-LM needs Transformer Engine 2.10 for it under "
                 "partial CUDA graphs; raise framework.transformer_engine or remove it"))
    if run.schedule.combined_1f1b and not (life is not None and life.reads_framework):
        add(("schedule.combined_1f1b", 'models Megatron-Core\'s schedule-plan nodes: set profile = "megatron"'))
    problems += cp_comm_problems(fw, m, par)
    problems += legacy_problems(fw, m, par)
    problems += architecture_run_problems(m, run.profile, run.trace is not None, par, tr, fw,
                                          full_recompute=run.recompute.policy == "full")
    problems += fp8_problems(run.training, run.framework, reads_framework=life is not None and life.reads_framework)
    sm = int(run.hardware.sm)
    # TE quantization.py: check_fp8_block_scaling_support (compute capability 9.0+), check_mxfp8_support (10.x, 11.x)
    if tr.fp8_recipe == "blockwise" and sm < 90:
        add(("training.fp8_recipe", f"Transformer Engine runs Float8BlockScaling from compute capability 9.0 (this "
             f"device: sm {sm}); use tensorwise or delayed"))
    if tr.fp8_recipe == "mxfp8" and not 100 <= sm < 120:
        add(("training.fp8_recipe", f"Transformer Engine runs MXFP8 on compute capability 10.x and 11.x (this device: "
             f"sm {sm}); use blockwise on Hopper, or tensorwise"))
    if tr.mxfp8_reuse_grad_buf and not (tr.fp8_param_gather and tr.fp8_recipe == "mxfp8"):
        # MC distributed_data_parallel_config.py: __post_init__ asserts fp8_param_gather (4e85d74ae9)
        add(("training.mxfp8_reuse_grad_buf", "reuses the grad buffer for MXFP8 parameters' all-gather: set "
             'fp8_recipe = "mxfp8" and fp8_param_gather = true, or remove it'))
    per_stage = m.num_hidden_layers // par.pp
    for key in ("fp8_bf16_first_layers", "fp8_bf16_last_layers"):
        if getattr(tr, key) > per_stage:  # transformer_config.py: "must be between 0 and number of layers per pipeline stage"
            add((f"training.{key}", f"{getattr(tr, key)} is more than the layers of a pipeline stage "
                 f"({m.num_hidden_layers} // pp {par.pp} = {per_stage}), which Megatron-LM refuses"))
    problems += cuda_graph_problems(fw, m, profile=run.profile, rc=run.recompute, sched=run.schedule,
                                    expandable_segments=run.allocator.expandable_segments, tr=tr)
    if fw.optimizer_impl != "te_fused" and life is not None and life.reads_framework:  # no TE (its Adam is first)
        if fw.transformer_impl == "transformer_engine":
            add(("framework.optimizer_impl", f'"{fw.optimizer_impl}" means Transformer Engine is not installed, '
                 'but transformer_impl = "transformer_engine" runs its layers; set transformer_impl = "local"'))
        if tr.precision_aware:
            add(("framework.optimizer_impl", "the precision-aware optimizer is Transformer Engine's FusedAdam; "
                 'set optimizer_impl = "te_fused" or precision_aware = false'))
    if fw.defer_embedding_wgrad and (par.pp == 1 or not fw.gradient_accumulation_fusion):
        # MC model_parallel_config.py: ModelParallelConfig.__post_init__ raises for either
        add(("framework.defer_embedding_wgrad", "Megatron-LM defers the output layer's weight gradient to the "
             "pipeline flush only with pp > 1 and gradient_accumulation_fusion"))
    if not (life is not None and life.reads_framework):
        default = FrameworkSpec()
        kept = life.framework_keys if life is not None else ()
        for f in dataclasses.fields(FrameworkSpec):
            if f.name not in kept and getattr(run.framework, f.name) != getattr(default, f.name):
                also = f" (profile {run.profile!r} reads only {', '.join(kept)})" if kept else ""
                add((f"framework.{f.name}", 'only the megatron profile reads [framework]' + also + '; remove it '
                     'or set profile = "megatron"'))

    # -- hardware -----------------------------------------------------------------------------
    hw = run.hardware
    if hw.non_pytorch_gib >= hw.capacity_gib:
        add(("hardware.non_pytorch_gib", f"{hw.non_pytorch_gib} leaves nothing of capacity_gib="
             f"{hw.capacity_gib} for PyTorch"))
    return before, problems


def run_recompute_problems(rc: RecomputeSpec, par: ParallelSpec, m: ModelSpec,
                           before: list[tuple[str, str]]) -> list[tuple[str, str]]:
    """:func:`validate_run`'s recompute section: ``rc`` against the layout and the model; ``before``:
    the problems found before it (a layout problem leaves full recompute's layer count unchecked)."""
    problems: list[tuple[str, str]] = []
    add = problems.append
    if isinstance(rc.num_layers, tuple) and len(rc.num_layers) != par.pp:
        add(("recompute.num_layers", f"has {len(rc.num_layers)} entries; give one per pipeline rank "
             f"(pp = {par.pp}) or a single integer"))
    elif not any(k == "parallel.layout" for k, _ in before):
        problems += recompute_problems(rc, par, m.num_hidden_layers)
    if rc.distribute_saved:  # Megatron-LM arguments.py: validate_args; transformer_config.py: __post_init__
        if rc.policy != "full":
            add(("recompute.distribute_saved", f'distributes full recompute\'s checkpoint inputs; policy is '
                 f'"{rc.policy}": use policy = "full" or remove it'))
        elif par.tp < 2:
            add(("recompute.distribute_saved", "splits each checkpoint input over the tensor-parallel ranks; "
                 "tp = 1: use tp > 1 or remove it"))
        elif par.sp:
            add(("recompute.distribute_saved", "Megatron-LM refuses it with sequence parallelism (the input is "
                 "already split): set parallel.sp = false or remove it"))
    if rc.policy == "selective":
        if "mla_up_proj" in rc.modules and not m.is_mla:
            add(("recompute.modules", f'"mla_up_proj" needs an MLA model; {m.name} has none'))
        for mod in ("moe", "moe_act", "shared_experts"):
            if mod in rc.modules and not m.is_moe:
                add(("recompute.modules", f'"{mod}" needs a mixture-of-experts model; {m.name} is dense'))
    return problems


def optimizer_problems(tr: TrainingSpec, profile: str, *, traced: bool) -> list[tuple[str, str]]:
    """The optimizer's fields against each other and the profile: only the ``megatron`` profile lays out
    SGD's, Muon's and the precision-aware Adam's states (:mod:`timeline.graph.optim_state`)."""
    out = list[tuple[str, str]]()
    megatron = profile == "megatron" and not traced
    for key, given in (("optimizer", tr.optimizer != "adam"), ("exp_avg_sq_dtype", bool(tr.exp_avg_sq_dtype))):
        if given and not megatron:
            out.append((f"training.{key}", 'is modelled with profile = "megatron" (and no captured trace) only; '
                        'remove it or use profile = "megatron"'))
    if tr.muon_layer_wise and tr.optimizer != "muon":
        out.append(("training.muon_layer_wise", f'needs optimizer = "muon" (optimizer is "{tr.optimizer}"); remove it'))
    if tr.precision_aware and not (megatron and tr.optimizer == "adam" and tr.zero == 1 and not tr.resumed):
        out.append(("training.precision_aware", "TE's FusedAdam holding the masters is modelled for Adam under "
                    "Megatron's distributed optimizer (profile = \"megatron\", zero = 1), not in a resumed run; "
                    "remove it"))
    if tr.optimizer_cpu_offload and not tr.precision_aware:
        # megatron/training/arguments.py: validate_args asserts it ("the hybrid device optimizer reuses the code path")
        out.append(("training.optimizer_cpu_offload", "Megatron-LM requires the precision-aware optimizer with it: "
                    "set precision_aware = true (--use-precision-aware-optimizer)"))
    if tr.optimizer_cpu_offload and (tr.grad_dtype != "fp32" or tr.fp8_param_gather):
        out.append(("training.optimizer_cpu_offload", "modelled with fp32 main gradients and no FP8 parameters: "
                    "bf16 gradients would be converted per shard on both sides, FP8 parameters give the hybrid "
                    "optimizer fp32 shards; set grad_dtype = \"fp32\" and fp8_param_gather = false"))
    if tr.optimizer_offload_fraction != 1.0 and not tr.optimizer_cpu_offload:
        out.append(("training.optimizer_offload_fraction", "is read only with optimizer_cpu_offload = true; set that "
                    "or remove it"))
    if tr.master_remainders and not (tr.precision_aware and tr.master_dtype == "fp32" and tr.dtype == "bf16"):
        out.append(("training.master_remainders", "needs precision_aware = true with bf16 weights and "
                    "master_dtype = \"fp32\" (TE stores the remainders of fp32 masters of bf16 weights); remove it"))
    if tr.optimizer == "muon" and tr.zero and not tr.muon_layer_wise:
        out.append(("training.zero", "Muon keeps whole parameters per rank, never the distributed optimizer's "
                    "shards: set zero = 0, or muon_layer_wise = true (Megatron's layer-wise distribution; with "
                    "zero = 1 in the distributed optimizer's buffers)"))
    return out
