"""A vision-language checkpoint's vision tower on one device: its weights and vLLM's encoder profile.

Read in vLLM 0.19.0 (``vllm/model_executor/models/pixtral.py``, ``mistral3.py``,
``vllm/v1/worker/gpu_model_runner.py``, ``vllm/multimodal/encoder_budget.py``).

**Weights.** ``PixtralHFVisionModel`` shards like the language model (``is_vit_use_data_parallel`` off by
default): ``qkv_proj`` (``QKVParallelLinear``, no bias) and ``o_proj`` (``RowParallelLinear``), the MLP's
``gate_up_proj`` (``MergedColumnParallelLinear``) and ``down_proj``; the convolution, the norms and the
patch merger's ``merging_layer`` (a plain ``nn.Linear``) are whole on every rank; the projector's ``linear_1``
is column- and ``linear_2`` row-parallel (a row-parallel bias is whole). Each linear takes the checkpoint's
quantization unless its ``ignore`` / ``modules_to_not_convert`` names it; the rest is in the model dtype.
With ``serving.limit_mm_per_prompt = 0`` (``--limit-mm-per-prompt '{"image": 0}'``) ``_mark_tower_model``
builds neither tower nor projector.

**The encoder profile** (``GPUModelRunner.profile_run``): before the language model's dummy step the runner
builds a batch of ``max_mm_items_per_batch`` dummy images of the largest size — ``EncoderBudget._get_max_items``:
the encoder budget (``max(max_num_batched_tokens, tokens of one image)``, both its compute budget and its
cache size) over one image's placeholder tokens, at most ``max_num_seqs`` × the images a prompt may hold
(``min(limit, max_model_len // tokens)``, at least 1) — and runs ``embed_multimodal`` on it, keeping the
outputs in the encoder cache (and the batch in ``batched_dummy_mm_inputs``) until the dummy step and the
sampler have run. ``PixtralHFVisionModel.forward``, eager, as PyTorch frees: each image cast to the model dtype
for its convolution (the fp32 batch stays), the convolutions' outputs held in ``patch_embeds_list`` to the end,
their concatenation normed by ``ln_pre`` (held as ``patch_embeds``), the 2-D RoPE cos/sin, and — vLLM installs
no xformers — transformers' ``generate_block_attention_mask``: one dense ``[S, S]`` mask in the model dtype
over all images' patches ``S``, alive through every layer. Each ``PixtralHFTransformerBlock``: the attention's
input norm (an argument, alive until the attention returns), ``qkv``, HF's ``apply_rotary_pos_emb`` (``q·cos``,
``rotate_half`` as a negated half and a concatenation, ``·sin``, the sum; the same for k), SDPA with the mask
(its memory-efficient kernel: the output only), ``o_proj``; ``h = x + r`` with ``r`` kept through the MLP;
``gate_up``, the fused SiLU-and-mul and ``down_proj`` (``gate_up`` a local until the MLP returns); ``out = h
+ r``. At tp > 1 each row-parallel output goes through vLLM's out-of-place all-reduce. Then
``_process_image_input`` concatenates the per-image views, the projector norms, unfolds each image's patch
grid and concatenates them, merges, and runs ``linear_1``, the activation and ``linear_2``, whose output the
encoder cache keeps.

**Gemma-3** (``siglip.py``, ``gemma3_mm.py``, 0.19.0): ``SiglipVisionModel``'s linears shard the same way (``fc1``
and ``fc2`` stay unquantized where the intermediate size is not a multiple of 64, as ``SiglipMLP`` decides); the
patch convolution, the position table, the LayerNorms and the projector's matrix are whole. Its encoder profile is
:func:`_siglip_profile`. How the encoder budget counts an image (its embeddings, or its whole placeholder) and the dummy images
changed over vLLM's versions (:func:`images_profiled`) — for Pixtral too.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from timeline.graph.tensors import DTYPE_BYTES
from timeline.serve.quant_layout import linear_bytes, skipped
from timeline.serve.transients import StepTransients, requested_peak
from timeline.spec.engine_versions import vllm_all_reduce_out_of_place, vllm_encoder_budget_rule
from timeline.spec.serving import ServeRunSpec
from timeline.spec.vision import VisionSpec


def built(run: ServeRunSpec) -> VisionSpec | None:
    """The vision tower the engine builds: none for a language model or ``limit_mm_per_prompt = 0``."""
    return run.vision if run.vision is not None and run.serving.limit_mm_per_prompt > 0 else None


#: (module, out rows, in columns on this rank, bias elements, quantizable) of a tower linear
Linear = tuple[str, int, int, int, bool]


def _linears(v: VisionSpec, tp: int) -> list[Linear]:
    """Pixtral's linears (every one quantizable)."""
    d, i, t = v.hidden_size, v.intermediate_size, v.text_hidden_size
    out: list[Linear] = []
    for layer in range(v.num_hidden_layers):
        p = f"vision_tower.transformer.layers.{layer}"
        out += [(f"{p}.attention.qkv_proj", 3 * d // tp, d, 0, True), (f"{p}.attention.o_proj", d, d // tp, 0, True),
                (f"{p}.feed_forward.gate_up_proj", 2 * i // tp, d, 0, True),
                (f"{p}.feed_forward.down_proj", d, i // tp, 0, True)]
    bias = v.projector_bias
    out += [("multi_modal_projector.linear_1", t // tp, d, t // tp if bias else 0, True),
            ("multi_modal_projector.linear_2", t, t // tp, t if bias else 0, True)]
    return out


def _linears_bytes(run: ServeRunSpec, linears: list[Linear]) -> int:
    """The linears' bytes on one rank: the checkpoint's quantized layout unless its ``ignore`` /
    ``modules_to_not_convert`` names the module (or the module is not quantizable), else the model dtype; biases in
    the model dtype."""
    act, q = DTYPE_BYTES[run.serving.dtype], run.quant
    total = 0
    for module, rows, cols, bias, quantizable in linears:
        if quantizable and q is not None and not skipped(f"{module}.weight", q.not_converted):
            total += linear_bytes(q, rows, cols, act)
        else:
            total += rows * cols * act
        total += bias * act
    return total


def _siglip_linears(v: VisionSpec, tp: int) -> list[Linear]:
    """The SigLIP tower's linears:
    ``qkv_proj`` (``QKVParallelLinear``) and ``fc1`` (``ColumnParallelLinear``) split their rows, ``out_proj`` and
    ``fc2`` (``RowParallelLinear``) their columns with a whole bias; every one biased (the layers' default).
    ``SiglipMLP`` quantizes ``fc1``/``fc2`` only where hidden and intermediate sizes are multiples of 64."""
    d, i = v.hidden_size, v.intermediate_size
    mlp_quant = d % 64 == 0 and i % 64 == 0
    out: list[Linear] = []
    for layer in range(v.num_hidden_layers):
        p = f"vision_tower.vision_model.encoder.layers.{layer}"
        out += [(f"{p}.self_attn.qkv_proj", 3 * d // tp, d, 3 * d // tp, True),
                (f"{p}.self_attn.out_proj", d, d // tp, d, True),
                (f"{p}.mlp.fc1", i // tp, d, i // tp, mlp_quant), (f"{p}.mlp.fc2", d, i // tp, d, mlp_quant)]
    return out


def _siglip_weight_bytes(run: ServeRunSpec, v: VisionSpec) -> int:
    """``SiglipVisionModel`` and ``Gemma3MultiModalProjector`` on one rank: the biased patch convolution, the
    ``[patches, hidden]`` position table and its int64 ``position_ids`` buffer, two LayerNorms per layer and
    ``post_layernorm`` (all layers are built, so it is), the linears (:func:`_siglip_linears`); the projector's
    RMSNorm and its ``[hidden, text hidden]`` matrix are plain parameters, whole on every rank."""
    act, tp, d = DTYPE_BYTES[run.serving.dtype], run.parallel.tp, v.hidden_size
    whole = d * v.num_channels * v.patch_size ** 2 + d + v.patches * d  # patch_embedding, position_embedding
    whole += 4 * d * v.num_hidden_layers + 2 * d  # layer_norm1/2 (weight, bias), post_layernorm
    whole += d + d * v.text_hidden_size  # mm_soft_emb_norm, mm_input_projection_weight
    return whole * act + v.patches * 8 + _linears_bytes(run, _siglip_linears(v, tp))  # + int64 position_ids


def vision_weight_bytes(run: ServeRunSpec) -> int:
    """Bytes of the vision tower and projector on one tensor-parallel rank (module docstring)."""
    v = built(run)
    if v is None:
        return 0
    if v.kind == "siglip":
        return _siglip_weight_bytes(run, v)
    act = DTYPE_BYTES[run.serving.dtype]
    tp = run.parallel.tp
    d = v.hidden_size
    whole = d * v.num_channels * v.patch_size ** 2 + d  # patch_conv (no bias), ln_pre
    whole += 2 * d * v.num_hidden_layers  # attention_norm, ffn_norm
    whole += d + d * d * v.spatial_merge_size ** 2  # projector norm, patch_merger.merging_layer (nn.Linear)
    # transformers' PixtralRotaryEmbedding (vLLM's import): the fp32 inv_freq buffer, one row per patch position
    return whole * act + v.patches * (d // v.num_attention_heads) * 4 + _linears_bytes(run, _linears(v, tp))


def tokens_per_image(run: ServeRunSpec, v: VisionSpec) -> int:
    """What the encoder budget counts for the largest image at the run's vLLM: its embeddings, or its placeholder's
    whole length (:func:`~timeline.spec.engine_versions.vllm_encoder_budget_rule`)."""
    counts, _ = vllm_encoder_budget_rule(run.serving.engine_version)
    return v.image_embeddings if counts == "embeds" else v.image_placeholder_tokens


def images_profiled(run: ServeRunSpec, v: VisionSpec) -> int:
    """Dummy images the encoder profile runs: the encoder budget (``max(max_num_batched_tokens, one image)``, its
    compute budget and cache size alike) over one image, against the decoder's ``max_num_seqs`` × images a prompt
    may hold, as the run's vLLM counts them (:func:`~timeline.spec.engine_versions.vllm_encoder_budget_rule`; 0.19.0
    ``MultiModalBudget._get_max_items``, module docstring)."""
    sv = run.serving
    per_image = tokens_per_image(run, v)
    budget = max(sv.max_num_batched_tokens, per_image)
    _, rule = vllm_encoder_budget_rule(sv.engine_version)
    if rule == "cdiv":
        return min(-(-budget // per_image), sv.max_num_seqs * sv.limit_mm_per_prompt)
    if rule == "floor":
        return max(1, min(budget // per_image, sv.max_num_seqs * sv.limit_mm_per_prompt))
    per_prompt = max(1, min(sv.limit_mm_per_prompt, run.max_model_len // per_image))
    seqs = sv.max_num_seqs if sv.enable_chunked_prefill else min(sv.max_num_seqs, sv.max_num_batched_tokens // per_image)
    return max(1, min(budget // per_image, seqs * per_prompt))


@dataclass
class _Plan:
    plan: list[tuple[int, int]] = field(default_factory=list)
    names: list[str] = field(default_factory=list)
    sizes: list[int] = field(default_factory=list)
    live: dict[str, int] = field(default_factory=dict)

    def alloc(self, name: str, size: int) -> str:
        self.live[name] = len(self.sizes)
        self.names.append(name)
        self.sizes.append(size)
        self.plan.append((size, -1))
        return name

    def free(self, *names: str) -> None:
        for name in names:
            self.plan.append((0, self.live.pop(name)))


def _row_parallel(p: _Plan, run: ServeRunSpec, name: str, size: int) -> str:
    """A row-parallel linear's output; at tp > 1 the all-reduce's new tensor replaces it (vLLM's out-of-place
    all-reduce)."""
    p.alloc(name, size)
    if run.parallel.tp == 1 or not vllm_all_reduce_out_of_place(run.serving.engine_version):
        return name
    p.alloc(f"{name}.all_reduce", size)
    p.free(name)
    return f"{name}.all_reduce"


def _siglip_profile(run: ServeRunSpec, v: VisionSpec) -> tuple[_Plan, list[str]]:
    """Gemma-3's encoder profile (vLLM 0.19.0 ``siglip.py``, ``gemma3_mm.py``), eager, as PyTorch frees. The dummy
    batch (fp32 pixels) is cast to the model dtype whole for the cuDNN convolution (``Conv2dLayer.forward_cuda``);
    the position table's lookup is added into the convolution's output in place, which ``SiglipEncoder.forward``'s
    ``hidden_states_pool`` and the tower's own variable keep to the tower's end. Each ``SiglipEncoderLayer``:
    ``layer_norm1`` (the first layer's reads the transposed convolution output, so ``layer_norm`` makes it
    contiguous first), ``qkv_proj``, FlashAttention's varlen output (the vision backend on compute capability 8.0
    and later for a head size that is a multiple of 8 up to 256: ``get_vit_attn_backend``) and its fp32
    ``softmax_lse`` ``[heads, tokens]`` (dropped by the wrapper), ``out_proj`` (the norm, qkv and the attention
    output die when the attention returns; the residual is added in place); ``layer_norm2``, ``fc1``, ``nn.GELU``'s
    new tensor (``fc1``'s freed), ``fc2`` (the activation and the norm freed), the residual added in place; the
    previous layer's output freed. ``post_layernorm``; then the projector: the features transposed to the patch
    grid and made contiguous, ``AvgPool2d``, the compiled Gemma RMSNorm, the matmul into the text width — kept in
    the encoder cache with the dummy batch. At 0.9.2 the tower is the same but for its attention
    (``MultiHeadAttention``: xformers' ``memory_efficient_attention_forward``, no log-sum-exp kept), so the fp32
    ``softmax_lse`` — never at the tower's peak, which is in its MLP — is the only difference."""
    a, tp = DTYPE_BYTES[run.serving.dtype], run.parallel.tp
    n = images_profiled(run, v)
    d, t = v.hidden_size, n * v.patches
    unit, local = t * d * a, t * (d // tp) * a
    inner = t * (v.intermediate_size // tp) * a
    p = _Plan()
    pixels = p.alloc("vision.pixel_values", n * v.num_channels * v.image_size ** 2 * 4)
    p.alloc("vision.pixel_values.to_dtype", n * v.num_channels * v.image_size ** 2 * a)
    emb = p.alloc("vision.patch_embedding", unit)
    p.free("vision.pixel_values.to_dtype")
    p.alloc("vision.position_embedding", v.patches * d * a)
    p.free("vision.position_embedding")
    x = emb
    for layer in range(v.num_hidden_layers):
        q = f"vision.layers.{layer}"
        if layer == 0:
            p.alloc(f"{q}.layer_norm1.contiguous", unit)
        ln1 = p.alloc(f"{q}.layer_norm1", unit)
        if layer == 0:
            p.free(f"{q}.layer_norm1.contiguous")
        qkv = p.alloc(f"{q}.qkv_proj", 3 * local)
        attn = p.alloc(f"{q}.flash_attn", local)
        p.alloc(f"{q}.softmax_lse", (v.num_attention_heads // tp) * t * 4)
        p.free(f"{q}.softmax_lse")
        h = _row_parallel(p, run, f"{q}.out_proj", unit)
        p.free(qkv, attn, ln1)
        ln2 = p.alloc(f"{q}.layer_norm2", unit)
        fc1 = p.alloc(f"{q}.fc1", inner)
        act = p.alloc(f"{q}.gelu", inner)
        p.free(fc1)
        out = _row_parallel(p, run, f"{q}.fc2", unit)
        p.free(act, ln2, h)
        if x != emb:
            p.free(x)
        x = out
    post = p.alloc("vision.post_layernorm", unit)
    p.free(x, emb)
    tokens = n * v.image_embeddings
    grid = p.alloc("projector.contiguous", unit)
    pooled = p.alloc("projector.avg_pool", tokens * d * a)
    normed = p.alloc("projector.mm_soft_emb_norm", tokens * d * a)
    embeds = p.alloc("projector.mm_input_projection", tokens * v.text_hidden_size * a)
    p.free(grid, pooled, normed, post)
    return p, [pixels, embeds]


def encoder_profile(run: ServeRunSpec) -> tuple[_Plan, list[str]]:
    """The encoder profile's allocations in order (module docstring) and the names it leaves allocated (the
    dummy batch and the encoder cache's outputs, freed after the language model's step)."""
    v = built(run)
    assert v is not None
    if v.kind == "siglip":
        return _siglip_profile(run, v)
    a = DTYPE_BYTES[run.serving.dtype]
    tp = run.parallel.tp
    n = images_profiled(run, v)
    d, hd = v.hidden_size, v.hidden_size // v.num_attention_heads
    s = n * v.patches
    unit = s * d * a  # one [S, D] activation
    local = s * (d // tp) * a  # one rank's q (or k, or the attention output)
    p = _Plan()

    def row_parallel(name: str, size: int) -> str:
        return _row_parallel(p, run, name, size)

    pixels = p.alloc("vision.pixel_values", n * v.num_channels * v.image_size ** 2 * 4)
    convs = []
    for k in range(n):
        p.alloc(f"vision.image{k}.to_dtype", v.num_channels * v.image_size ** 2 * a)
        convs.append(p.alloc(f"vision.patch_conv{k}", v.patches * d * a))
        p.free(f"vision.image{k}.to_dtype")
    p.alloc("vision.patch_embeds.cat", unit)
    first = p.alloc("vision.ln_pre", unit)
    p.free("vision.patch_embeds.cat")
    rope = [p.alloc("vision.rope.cos", s * hd * a), p.alloc("vision.rope.sin", s * hd * a)]
    mask = p.alloc("vision.attention_mask", s * s * a)
    x = first
    for layer in range(v.num_hidden_layers):
        q = f"vision.layers.{layer}"
        norm = p.alloc(f"{q}.attention_norm", unit)
        qkv = p.alloc(f"{q}.qkv", 3 * local)
        embeds = []
        for part in ("q", "k"):  # HF apply_rotary_pos_emb: x·cos + rotate_half(x)·sin
            p.alloc(f"{q}.{part}_cos", local)
            p.alloc(f"{q}.{part}_neg_half", local // 2)
            p.alloc(f"{q}.{part}_rotate_half", local)
            p.free(f"{q}.{part}_neg_half")
            p.alloc(f"{q}.{part}_sin", local)
            p.free(f"{q}.{part}_rotate_half")
            embeds.append(p.alloc(f"{q}.{part}_embed", local))
            p.free(f"{q}.{part}_cos", f"{q}.{part}_sin")
        attn = p.alloc(f"{q}.sdpa", local)
        r = row_parallel(f"{q}.o_proj", unit)
        p.free(qkv, *embeds, attn, norm)
        h = p.alloc(f"{q}.h", unit)
        norm2 = p.alloc(f"{q}.ffn_norm", unit)
        gate_up = p.alloc(f"{q}.gate_up", s * (2 * v.intermediate_size // tp) * a)
        act = p.alloc(f"{q}.act_and_mul", s * (v.intermediate_size // tp) * a)
        down = row_parallel(f"{q}.down_proj", unit)
        p.free(gate_up, act, norm2, r)
        out = p.alloc(f"{q}.out", unit)
        p.free(h, down)
        if x != first:
            p.free(x)
        x = out
    p.free(mask, *rope, *convs, first)
    merged_rows = s // v.spatial_merge_size ** 2
    feats = p.alloc("vision.features.cat", unit)
    norm = p.alloc("projector.norm", unit)
    p.free(feats)
    unfolds = [p.alloc(f"projector.unfold{k}", v.patches * d * a) for k in range(n)]
    grid = p.alloc("projector.patch_merger.cat", unit)
    merged = p.alloc("projector.merging_layer", merged_rows * d * a)
    p.free(grid, *unfolds, norm)
    l1 = p.alloc("projector.linear_1", merged_rows * (v.text_hidden_size // tp) * a)
    gelu = p.alloc("projector.act", merged_rows * (v.text_hidden_size // tp) * a)
    p.free(merged, l1)
    l2 = row_parallel("projector.linear_2", merged_rows * v.text_hidden_size * a)
    p.free(gelu, x)
    return p, [pixels, l2]


def with_encoder_profile(run: ServeRunSpec, step: StepTransients, first: int) -> StepTransients:
    """The profile run's plan: ``step``'s first ``first`` allocations (the buffers that exist before the encoder
    runs: the cuBLAS workspace its first GEMM makes), the encoder profile, then the rest of ``step`` (the kept
    buffers the language model's step and sampler make, the step, the sampler), after which the encoder's
    outputs and the dummy batch are freed."""
    enc, kept = encoder_profile(run)
    k = len(enc.sizes)
    head = list(step.plan[:first])
    mid = [(size, -1) if j < 0 else (0, j + first) for size, j in enc.plan]
    tail = [(size, -1) if j < 0 else (0, j if j < first else j + k) for size, j in step.plan[first:]]
    end = [(0, first + enc.live[name]) for name in kept]
    plan = head + mid + tail + end
    names = tuple(step.names[:first]) + tuple(enc.names) + tuple(step.names[first:])
    sizes = [size for size, j in plan if j < 0]
    return StepTransients(plan=tuple(plan), requested_peak_bytes=requested_peak(plan, sizes), names=names)
