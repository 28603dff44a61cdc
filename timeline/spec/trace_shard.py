"""How a captured trace's parameters shard under TP and EP: a rule per Hugging Face parameter name.

A trace runs sharded by the graph's own rules (the analytic families), applied to the captured
parameter names of Hugging Face decoder models (Llama, Mistral, Qwen2/3, Qwen-MoE,
Mixtral, GPT-OSS):

- column-parallel (Megatron ``ColumnParallelLinear``; :mod:`timeline.graph.families.attention`,
  ``mlp``): ``q_proj``, ``k_proj``, ``v_proj``, ``qkv_proj``, ``gate_proj``, ``up_proj``,
  ``gate_up_proj`` — weight rows (output features) and bias split over ``tp``;
- row-parallel (``RowParallelLinear``): ``o_proj``, ``down_proj`` — weight columns split, bias replicated;
- vocabulary-parallel (``VocabParallelEmbedding``, the output layer): ``embed_tokens``, ``lm_head`` —
  rows padded to the profile's ``vocab_pad · tp`` (``BuildCtx.padded_vocab``) and split over ``tp``;
- routed experts (:mod:`timeline.graph.families.moe`): a fused ``experts.*`` tensor whose first dim
  is the expert count keeps ``E / ep`` experts; a per-expert ``experts.N.*`` module is held by the
  EP rank whose ``E / ep`` experts include ``N`` (rank 0 is simulated); each expert's FFN width
  (``moe_intermediate_size``, ``2×`` fused gate/up) splits over ``etp``, its down bias stays whole;
- split with the heads: GPT-OSS's learned ``self_attn.sinks`` (one logit per query head);
- replicated: norms, biases of row-parallel layers, the router (``mlp.gate``/``mlp.router``, replicated
  in Megatron's ``TopKRouter``), Qwen's ``shared_expert_gate``, buffers.

A layer parameter of two or more dimensions that no rule names cannot be split safely: under tp the
run is refused (:func:`shard_problems`); under ep alone only unnamed expert tensors are. Context parallelism
is refused too. Nothing here imports torch or reads files.
"""

from __future__ import annotations

import re
from dataclasses import dataclass

from timeline.spec.run import ParallelSpec
from timeline.spec.trace import CapturedTrace, TraceParam

COLUMN = ("q_proj", "k_proj", "v_proj", "qkv_proj", "gate_proj", "up_proj", "gate_up_proj")
ROW = ("o_proj", "down_proj")
VOCAB = ("embed_tokens", "lm_head")
#: replicated matrices: the MoE router (``mlp.gate``; GPT-OSS ``mlp.router``) and Qwen's shared-expert gate
REPLICATED = ("mlp.gate", "mlp.router", "shared_expert_gate")
#: one value per attention head, split with the heads (GPT-OSS's learned sinks)
HEADS = ("self_attn.sinks",)
_EXPERT = re.compile(r"(^|\.)experts\.(\d+)\.")


@dataclass(frozen=True, slots=True, kw_only=True)
class TraceShard:
    """What a run's ``[parallel]`` asks of a trace: the ranks, and the vocabulary and expert counts."""

    tp: int = 1
    sp: bool = False
    ep: int = 1
    vocab: int = 0  # captured vocabulary rows
    vocab_local: int = 0  # rows one TP rank holds: the profile's padded vocabulary / tp
    experts: int = 0  # routed experts of the captured model
    etp: int = 1  # expert tensor-parallel ranks: each expert's FFN width split over them
    ffn: int = 0  # each routed expert's captured FFN width (``moe_intermediate_size``)
    #: the captured sizes TP splits (head counts, projection and FFN widths): the dim a local shape cuts
    split_dims: tuple[int, ...] = ()

    @property
    def sharded(self) -> bool:
        return self.tp > 1 or self.ep > 1 or self.etp > 1


def _module(name: str) -> str:
    """The parameter's module path's last part (``…q_proj.weight`` → ``q_proj``; fused experts keep theirs)."""
    parts = name.split(".")
    return parts[-2] if len(parts) > 1 else parts[0]


def param_role(p: TraceParam, experts: int) -> str:
    """``column`` | ``row`` | ``row_bias`` | ``vocab`` | ``expert`` | ``expert_module`` | ``replicated`` |
    ``unknown`` (a layer matrix no rule names)."""
    name = p.name
    if ".experts." in f".{name}" and "shared" not in name:
        if _EXPERT.search(name):
            return "expert_module"
        if experts and p.shape and p.shape[0] == experts:
            return "expert"
        return "unknown"
    mod, leaf = _module(name), name.rsplit(".", 1)[-1]
    if mod in COLUMN or name.endswith(HEADS):
        return "column"
    if mod in ROW:
        return "row" if leaf != "bias" else "row_bias"
    if mod in VOCAB:
        return "vocab"
    if not p.trainable or len(p.shape) < 2 or any(f"{r}." in name for r in REPLICATED):
        return "replicated"
    return "unknown" if p.layer >= 0 else "replicated"


def local_shape(p: TraceParam, shard: TraceShard) -> tuple[int, ...] | None:
    """The shape one device (TP rank 0, EP rank 0) holds of ``p``; None where that device holds none of it."""
    shape = list(p.shape)
    role = param_role(p, shard.experts)
    if role == "column":
        shape[0] //= shard.tp
    elif role == "row":
        shape[-1] //= shard.tp
    elif role == "vocab" and shape and shape[0] == shard.vocab:
        shape[0] = shard.vocab_local
    elif role == "expert":
        shape[0] //= shard.ep
        _cut_ffn(shape, shard, 1)
    elif role == "expert_module":
        m = _EXPERT.search(p.name)
        if m and int(m.group(2)) >= shard.experts // shard.ep:
            return None
        _cut_ffn(shape, shard, 0)
    return tuple(shape)


def expert_part(name: str) -> str:
    """``row`` for an expert's down projection (Megatron ``linear_fc2``, split by its input columns over
    etp), ``column`` for the gate/up projection (``linear_fc1``)."""
    return "row" if "down_proj" in name else "column"


def _cut_ffn(shape: list[int], shard: TraceShard, start: int) -> None:
    """Split an expert tensor's FFN-width dim (``ffn``, or ``2·ffn`` for a fused gate/up) over ``etp``; the
    last such dim from ``start`` (a width equal to the hidden size cuts the same bytes either way)."""
    if shard.etp == 1:
        return
    dims = [i for i in range(start, len(shape)) if shape[i] in (shard.ffn, 2 * shard.ffn)]
    if dims:
        shape[dims[-1]] //= shard.etp


def shard_problems(trace: CapturedTrace, par: ParallelSpec, experts: int) -> list[tuple[str, str]]:
    """What a sharded run asks of a (forward + backward) trace that these rules cannot give, as (key, message)."""
    problems: list[tuple[str, str]] = []
    if par.cp > 1:
        problems.append(("parallel.cp", "a captured trace shards over tp, sp and ep only; cp must be 1"))
    if par.tp == 1 and par.ep == 1 and par.etp == 1:
        return problems
    roles = {p.name: param_role(p, experts) for p in trace.params}
    # under ep alone only the experts move: other layer matrices stay whole on every rank
    unknown = [n for n, r in roles.items() if r == "unknown" and (par.tp > 1 or ".experts." in f".{n}")]
    if unknown:
        problems.append((f"parallel.{'tp' if par.tp > 1 else 'ep'}",
                         f"the trace's layer parameter {unknown[0]!r} matches no sharding rule (Hugging Face "
                         "q/k/v/o_proj, gate/up/down_proj, experts, router, norms); tp and ep must be 1"))
    elif par.tp > 1 and not any(r in ("column", "row") for r in roles.values()):
        problems.append(("parallel.tp", "the trace has no attention or MLP projections (Hugging Face q/k/v/o_proj, "
                         "gate/up/down_proj) to split; tp must be 1"))
    has_experts = any(r in ("expert", "expert_module") for r in roles.values())
    if par.ep > 1 and not has_experts:
        problems.append(("parallel.ep", "the trace has no routed experts to place; ep must be 1"))
    return problems
