"""One engine step's transient tensors through the caching-allocator model.

Forward only, nothing saved: every output of an op is allocated when the op starts and freed after
its last consumer (inference mode keeps no autograd graph), in the graph's dataflow order. The
logits and sampler buffers follow (:func:`sampler_tensors`). This is the *eager* op graph; vLLM's
``torch.compile`` fuses elementwise ops (residual add into RMSNorm, SiLU·mul), which lowers the
peak — not modelled, stated in the summary as ``activation_graph = "eager"``.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass

from timeline.alloc.caching import CachingAllocator
from timeline.alloc.config import AllocatorConfig
from timeline.graph.ir import FOp
from timeline.graph.tensors import DTYPE_BYTES
from timeline.serve.profile_run import fp32_copy_bytes
from timeline.spec.serving import ServeRunSpec


@dataclass(frozen=True, slots=True, kw_only=True)
class StepTransients:
    """One step's allocations in order: ``plan`` entries are ``(size, -1)`` for a malloc (the
    i-th malloc is allocation i) and ``(0, i)`` for freeing allocation i."""

    plan: tuple[tuple[int, int], ...]
    requested_peak_bytes: int
    names: tuple[str, ...] = ()  # tensor name of each allocation (memory_viz frames)


#: names of :func:`sampler_tensors`' buffers, in order
SAMPLER_NAMES = ("sampler.logits_local", "sampler.logits_gathered", "sampler.logits_fp32",
                 "sampler.sort_values", "sampler.sort_indices", "sampler.sort_reverse_indices", "sampler.sort_cub_temp")


def sampler_tensors(run: ServeRunSpec, num_reqs: int, *, profile: bool = False,
                    model_dtype_sort: bool = False) -> list[int]:
    """The logits and sampler buffers alive together at the sampler's peak over ``num_reqs`` rows
    (always ``len(SAMPLER_NAMES)`` entries, 0 for a buffer that is not made).

    ``compute_logits`` on one hidden row per request gives ``num_reqs × vocab/tp`` in the model
    dtype and ``tensor_model_parallel_gather`` the full ``num_reqs × vocab`` (tp > 1); vLLM's V1
    ``Sampler.forward`` (``vllm/v1/sample/sampler.py``) casts it to fp32 and scales by temperature in
    place. The profile run (``gpu_model_runner.py`` ``_dummy_sampler_run``) gives every dummy request
    ``top_p = 0.9`` and ``top_k = vocab − 1``, so the PyTorch-native top-k/top-p path
    (``topk_topp_sampler.py`` ``TopKTopPSampler.forward_native`` → ``apply_top_k_top_p``, the
    default on CUDA unless ``VLLM_USE_FLASHINFER_SAMPLER=1``) sorts the fp32 logits: the sort's fp32
    values and int64 indices, and inside PyTorch's CUDA sort (``aten/src/ATen/native/cuda/
    SortStable.cu`` ``segmented_sort_pairs``, taken for ≥ 128 rows of > 4,096) an int64
    ``reverse_indices`` buffer and CUB's ``DeviceSegmentedRadixSort::SortPairs`` temporary storage,
    which holds the alternate key (fp32) and value (int64) buffers. A serving step's requests
    sample with the defaults (no top-k/top-p): its peak is the fp32 logits plus the probabilities
    and the exponential noise of ``random_sample`` (two more fp32 copies)."""
    m, tp = run.model, run.parallel.tp
    from timeline.serve.graph_view import VOCAB_PADDING

    vocab = -(-m.vocab_size // VOCAB_PADDING) * VOCAB_PADDING
    act = DTYPE_BYTES[run.serving.dtype]
    n = num_reqs * m.vocab_size
    local = num_reqs * (vocab // tp) * act
    full = n * act if tp > 1 else 0
    if profile and model_dtype_sort:  # vLLM ≤ 0.5: no fp32 copy, the sort's keys in the model dtype
        return [local, full, 0, n * act, n * 8, n * 8, n * (act + 8)]
    copy = fp32_copy_bytes(run, n)  # none under an fp32 model: the cast returns the logits themselves
    if profile:
        return [local, full, copy, n * 4, n * 8, n * 8, n * (4 + 8)]
    return [local, full, copy, n * 4, n * 4, 0, 0]


def step_transients(ops: list[FOp], extra: Sequence[int] = (), *, extra_names: Sequence[str] = (),
                    first: Sequence[tuple[str, int]] = (), holds: dict[str, int] | None = None) -> StepTransients:
    """Allocation plan of a forward step: each op allocates its outputs when it starts and frees,
    when it ends, every tensor whose last consumer it is; the ``extra`` buffers (logits, sampler;
    named ``extra_names``, else :data:`SAMPLER_NAMES`) follow the last op's outputs and live to the
    step's end with them. ``first`` (name, bytes) are allocated before the first op and kept to the
    end: buffers the step creates once and keeps (a workspace made by its first use). ``holds`` keeps
    a storage until the op of that index at least (a Python reference outliving its last use:
    :func:`eager_holds`)."""
    last: dict[str, int] = {}
    for i, op in enumerate(ops):
        for t in op.inputs.values():
            last[t.storage] = i
    for storage, until in (holds or {}).items():
        last[storage] = max(last.get(storage, until), until)
    index: dict[str, int] = {}
    plan: list[tuple[int, int]] = []
    sizes: list[int] = []
    names: list[str] = []
    dies: dict[int, list[int]] = {}
    for name, size in first:
        dies.setdefault(len(ops), []).append(len(sizes))
        names.append(name)
        sizes.append(size)
        plan.append((size, -1))
    for i, op in enumerate(ops):
        for t in op.outputs.values():
            if t.storage in index:
                continue
            index[t.storage] = len(sizes)
            sizes.append(t.size_bytes)
            names.append(t.name)
            plan.append((t.size_bytes, -1))
            end = last.get(t.storage, len(ops))  # never consumed: the step's output, kept to the end
            dies.setdefault(max(end, i), []).append(index[t.storage])
        if "workspace" in op.tags:  # a fused kernel's scratch buffers: allocated after its output, freed at its end
            for t in op.extras.values():
                index[t.storage] = len(sizes)
                sizes.append(t.size_bytes)
                names.append(t.name)
                plan.append((t.size_bytes, -1))
                dies.setdefault(i, []).append(index[t.storage])
        plan += [(0, j) for j in dies.pop(i, [])]
    labels = tuple(extra_names) or SAMPLER_NAMES
    for k, size in enumerate(extra):
        dies.setdefault(len(ops), []).append(len(sizes))
        names.append(labels[k] if k < len(labels) else f"extra.{k}")
        sizes.append(size)
        plan.append((size, -1))
    plan += [(0, j) for j in dies.pop(len(ops), [])]
    return StepTransients(plan=tuple(plan), requested_peak_bytes=requested_peak(plan, sizes), names=tuple(names))


def eager_holds(ops: Sequence[FOp]) -> dict[str, int]:
    """What eager PyTorch keeps past a tensor's last use in vLLM's decoder layers
    (``vllm/model_executor/models/llama.py`` ``LlamaDecoderLayer.forward`` / ``LlamaMLP.forward``, the
    same in every family's module): the caller's ``hidden_states`` argument stays referenced while
    ``self.self_attn(...)`` and ``self.mlp(...)`` run, so each sub-block's input lives to its last op,
    and ``LlamaMLP.forward``'s local ``gate_up`` lives until ``down_proj`` has run (``x`` is rebound,
    ``gate_up`` is not). A row-parallel linear's input lives through its all-reduce as well: the caller's
    ``x, _ = self.down_proj(x)`` (``self.o_proj(attn_output)``) rebinds it only when the module returns,
    after ``RowParallelLinear.forward``'s ``tensor_model_parallel_all_reduce``. Compiled graphs free at
    last use instead."""
    holds: dict[str, int] = {}
    blocks: dict[str, list[int]] = {}
    for i, op in enumerate(ops):
        if i and op.name == f"{ops[i - 1].name}.all_reduce":
            for t in ops[i - 1].dataflow_inputs():
                holds[t.storage] = max(holds.get(t.storage, i), i)
        if op.layer is None:
            continue
        for part in ("self_attn", "mlp"):
            if op.name.startswith(f"layers.{op.layer}.{part}."):
                blocks.setdefault(f"layers.{op.layer}.{part}", []).append(i)
    for name, idx in blocks.items():
        first, end = ops[idx[0]], idx[-1]
        if "x" in first.inputs:
            holds[first.inputs["x"].storage] = end
        if name.endswith(".mlp"):
            for i in idx:
                if ops[i].name.endswith(".linear_fc1"):
                    for t in ops[i].outputs.values():
                        holds[t.storage] = end
    return holds


def step_transients_scaled(one: StepTransients, tokens: int, extra: list[int]) -> StepTransients:
    """The plan of a ``tokens``-token step from the one-token plan (built with ``len(extra)``
    zero-byte extra buffers) of a step whose tensors are all linear in its tokens: the same
    allocations in the same order, op tensors scaled by ``tokens``, the extras set to ``extra``."""
    per_token = [size for size, j in one.plan if j < 0]
    return step_transients_affine(one, per_token, [0] * len(per_token), tokens, 0, extra)


def step_transients_affine(one: StepTransients, per_token: Sequence[int], per_moe: Sequence[int], tokens: int,
                           moe_tokens: int, extra: list[int]) -> StepTransients:
    """The plan of a step whose op tensors are each ``a·tokens + b·moe_tokens`` bytes (``per_token``
    and ``per_moe`` give a and b for every allocation before the extras of the template ``one``,
    built with ``len(extra)`` zero-byte extra buffers): the same allocations in the same order."""
    n = sum(1 for _, j in one.plan if j < 0)
    first_extra = n - len(extra)
    plan: list[tuple[int, int]] = []
    sizes: list[int] = []
    for _, j in one.plan:
        if j < 0:
            k = len(sizes)
            size = extra[k - first_extra] if k >= first_extra else per_token[k] * tokens + per_moe[k] * moe_tokens
            sizes.append(size)
            plan.append((size, -1))
        else:
            plan.append((0, j))
    return StepTransients(plan=tuple(plan), requested_peak_bytes=requested_peak(plan, sizes), names=one.names)


def requested_peak(plan: Sequence[tuple[int, int]], sizes: Sequence[int]) -> int:
    """The most bytes live at once when ``plan`` (size, −1 = alloc | 0, j = free of alloc j) plays out."""
    live = peak = 0
    for size, j in plan:
        live += size if j < 0 else -sizes[j]
        peak = max(peak, live)
    return peak


def run_through_allocator(alloc: CachingAllocator, st: StepTransients,
                          record: Callable[[str, int, int, str], None] | None = None) -> int:
    """Play one step into ``alloc``; return the peak allocated bytes it reached (PyTorch's
    ``allocated_bytes.all.peak`` over the step), leaving every block of the step freed.
    ``record(action, address, size, tensor)`` hears each alloc and free (memory_viz trace)."""
    addrs: list[int] = []
    sizes: list[int] = []
    peak = alloc.allocated_bytes
    for size, j in st.plan:
        if j < 0:
            addrs.append(alloc.malloc(size) if size else 0)  # a buffer this step does not make
            sizes.append(size)
            peak = max(peak, alloc.allocated_bytes)
            if record is not None and size:
                record("alloc", addrs[-1], size, st.names[len(addrs) - 1] if st.names else "")
        elif addrs[j]:
            alloc.free(addrs[j])
            if record is not None:
                record("free", addrs[j], sizes[j], st.names[j] if st.names else "")
    return peak


def new_allocator(run: ServeRunSpec, capacity_bytes: int) -> CachingAllocator:
    return CachingAllocator(AllocatorConfig.from_spec(run.allocator), capacity_bytes=capacity_bytes)
