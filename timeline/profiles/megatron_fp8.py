"""FP8 training's static state in a Megatron-Core + Transformer Engine job (``[training] fp8_recipe``,
``fp8_param_gather``): which parameters are FP8 and the FP8 weight copies TE keeps between
micro-batches. The saved activations are :mod:`timeline.graph.families.fp8`'s.

- FP8 parameters (``--fp8-param-gather``): Megatron builds the TE modules under ``fp8_model_init``
  (``core/fp8_utils.py`` / ``extensions/transformer_engine.py``), so every TE linear weight of the
  decoder layers is a ``Float8Tensor`` of one byte per element; DDP groups parameters by
  (param dtype, grad dtype) with a Float8Tensor's as ``torch.uint8``
  (``distributed/distributed_data_parallel.py: _allocate_buffers_for_parameters``), so those weights
  get a param buffer of their own (their fp32 grad buffer and fp32 main parameters as before). Where
  FP8 GEMMs need TN layouts (Hopper: ``utils.py: is_non_tn_fp8_gemm_supported`` false) the weight's
  backward makes its ``[in, out]`` transpose (``float8_tensor_storage.py: update_usage`` →
  ``_create_transpose``), and ``fp8_utils.py: post_all_gather_processing`` keeps it after each
  parameter all-gather (Megatron-LM 1666b458c8, TE ≥ 2.2): one more byte per element, held for good.
- Without FP8 parameters TE quantizes each weight into a cached workspace
  (``module/base.py: TransformerEngineBaseModule.get_weight_workspace`` with
  ``cache_name="weight"``: Megatron passes ``is_first_microbatch``, ``extensions/transformer_engine.py:
  TELinear.forward``, unless ``--disable-parameter-transpose-cache``) kept between micro-batches and
  iterations: the ``[out, in]`` FP8 data, on Hopper its transpose, and a ``[1]`` fp32 ``scale_inv``
  (``tensor/float8_tensor.py: Float8Quantizer.make_empty``).

- Under the delayed recipe each TE module's first FP8 forward (``module/base.py: init_fp8_metadata`` →
  ``init_fp8_meta_tensors`` → ``set_meta_tensor``; at construction under FP8 parameters) makes a
  ``DelayedScalingRecipeState`` (``fp8.py``) for its forward (3 quantizers per GEMM: input, weight, output)
  and its backward (2: grad output, grad input): an fp32 ``scale`` of one element per quantizer and an fp32
  ``amax_history`` of ``[--fp8-amax-history-len, quantizers]`` each, kept for good (the quantizers and
  ``FP8GlobalStateManager``'s global buffers hold views of them): :func:`amax_histories`.

Read at TE v2.2 … v2.16. Not modelled: the current-scaling recipe's own ``[quantizers]`` fp32 scale and amax
(a few hundred bytes per module).
"""

from __future__ import annotations

import re
from collections.abc import Sequence

from timeline.profiles.base import ParamTensor

TE_FP8 = "NVIDIA/TransformerEngine@v2.2..v2.16:transformer_engine/pytorch"
#: names of 2-D decoder-layer weights that are not TE linears (the router, the shared-expert gate)
NOT_TE = (".gate.weight", ".shared_expert_gate.", "embedding")


#: an MTP module's TE linears (``mtp.K.…``): its transformer layer's and its ``eh_proj``
#: (``TEColumnParallelLinear`` under the TE spec: ``multi_token_prediction.py: get_mtp_layer_spec_for_backend``)
_MTP_TE = re.compile(r"^mtp\.\d+\.(layer\.|eh_proj\.)")


def is_te_linear_weight(name: str, shape: tuple[int, ...]) -> bool:
    """Whether the parameter is a TE linear's weight of a decoder layer or of an MTP module (FP8 under
    ``fp8_param_gather``: Megatron builds the MTP layers under ``get_fp8_context(config, is_init=True)``,
    ``multi_token_prediction.py: MultiTokenPredictionBlock._build_layers``@4e85d74ae9)."""
    return ((name.startswith("layers.") or _MTP_TE.match(name) is not None) and name.endswith(".weight")
            and len(shape) == 2 and not any(k in name for k in NOT_TE))


MC_FP8 = "NVIDIA/Megatron-LM@d98e8a64dd:megatron/core/fp8_utils.py"
_LAYER = re.compile(r"^layers\.(\d+)\.")


def bf16_layer(layer: int | None, first: int, last: int, num_layers: int) -> bool:
    """Whether decoder layer ``layer`` (its global index) stays out of FP8 under ``--first-last-layers-bf16``
    (``fp8_utils.py: is_first_last_bf16_layer``: index < start count, or ≥ num_layers − end count; ``get_fp8_context``
    then gives a nullcontext both for the layer's ``fp8_autocast`` and its ``fp8_model_init``). The MTP layers, whose
    index is past ``num_layers``, never are: ``MultiTokenPredictionLayer.forward`` runs its ``eh_proj`` and its
    transformer layer under ``get_fp8_context(self.config)`` — no layer number, so the global FP8 context whatever
    ``--first-last-layers-bf16`` says ("currently MTP only use global fp8 context"; Megatron-LM 20c635bb9b,
    2025-04-24, … d98e8a64dd; before it the MTP layer made its own ``fp8_autocast``), and builds them under
    ``get_fp8_context(self.config, is_init=True)`` alike."""
    return (layer is not None and 0 <= layer < num_layers and (layer < first or layer >= num_layers - last)
            and (first or last) > 0)


def is_fp8_weight(name: str, shape: tuple[int, ...], first: int, last: int, num_layers: int) -> bool:
    """A TE linear weight (:func:`is_te_linear_weight`) of a layer that runs in FP8 (:func:`bf16_layer`)."""
    if not is_te_linear_weight(name, shape):
        return False
    m = _LAYER.match(name)
    return not (m and bf16_layer(int(m.group(1)), first, last, num_layers))


def needs_transpose(sm: int) -> bool:
    """Whether FP8 GEMMs on compute capability ``sm`` take only TN layouts, so a column-wise FP8 copy is a
    transpose of its own (``utils.py: is_non_tn_fp8_gemm_supported``: 10.x, 11.x and ≥ 13.0 take any)."""
    return not (100 <= sm < 120 or sm >= 130)


def _up(x: int, m: int) -> int:
    return -(-x // m) * m


def input_scale(recipe: str, shape: tuple[int, ...]) -> tuple[tuple[int, ...], str]:
    """The scale a linear's saved FP8 input carries, for its column-wise (weight-gradient) use, of an input
    ``[rows, in]``: one fp32 ``scale_inv`` under the per-tensor recipes (``tensor/float8_tensor.py``); under
    ``blockwise`` (``Float8BlockQuantizer`` of 1×128 blocks) an fp32 scale per 128 rows of each column,
    ``(ceil(rows / 128), round_up(in, 4))`` (``float8_blockwise_tensor.py: get_scale_shape``, the compact
    all-gather form of a sequence-parallel input has ``in`` unpadded: the same bytes for ``in`` a multiple of 4);
    under ``mxfp8`` (``MXFP8Quantizer``) an E8M0 byte per 32 rows of each column,
    ``(round_up(rows / 32, 4), round_up(in, 128))`` (``mxfp8_tensor.py: make_empty``)."""
    rows = 1
    for d in shape[:-1]:
        rows *= d
    cols = shape[-1]
    if recipe == "blockwise":
        return (-(-rows // 128), _up(cols, 4)), "fp32"
    if recipe == "mxfp8":
        return (_up(-(-rows // 32), 4), _up(cols, 128)), "uint8"
    return (1,), "fp32"


def block_weight_scales(recipe: str, out: int, inp: int) -> tuple[int, int]:
    """(row-wise, column-wise) scale bytes of an ``[out, in]`` weight quantized under a block-scaled recipe:
    ``blockwise`` 128 × 128 blocks of fp32 (``float8_blockwise_tensor.py: get_scale_shape`` for 2-D blocks:
    ``(ceil(out/128), round_up(ceil(in/128), 4))`` and its transpose's), ``mxfp8`` 1 × 32 blocks of E8M0
    bytes (``mxfp8_tensor.py: make_empty``: ``(round_up(out, 128), round_up(in/32, 4))`` and
    ``(round_up(out/32, 4), round_up(in, 128))``)."""
    if recipe == "blockwise":
        rows, cols = -(-out // 128), -(-inp // 128)
        return 4 * rows * _up(cols, 4), 4 * cols * _up(rows, 4)
    return _up(out, 128) * _up(inp // 32, 4), _up(out // 32, 4) * _up(inp, 128)


def weight_caches(tensors: Sequence[ParamTensor], *, param_gather: bool, sm: int,
                  bf16: tuple[int, int, int] = (0, 0, 0), recipe: str = "tensorwise") -> list[tuple[str, int, str]]:
    """(name, bytes, source) of the persistent FP8 weight copies one device holds (``bf16``: the first and last
    layer counts kept in the model dtype and the model's layers, :func:`bf16_layer`). Under a block-scaled
    ``recipe`` (``blockwise``, ``mxfp8``) the cached workspace holds both usages on every GPU — row-wise data for
    the forward GEMM, column-wise data (blockwise: the transpose; MXFP8: a same-shape copy) for the input
    gradient — each with its block scales (:func:`block_weight_scales`)."""
    out = []
    for t in tensors:
        if not (t.trainable and is_fp8_weight(t.name, t.shape, *bf16)):
            continue
        numel = t.shape[0] * t.shape[1]
        if recipe in ("blockwise", "mxfp8"):
            row, col = block_weight_scales(recipe, t.shape[0], t.shape[1])
            if param_gather:  # the row-wise data is the parameter; TE's post_all_gather_processing makes the rest
                src = f"{TE_FP8}/tensor/utils.py: post_all_gather_processing (blockwise: column-wise storage, kept)"
                out += [(f"fp8.param_scale_inv.{t.name}", row, src), (f"fp8.param_columnwise.{t.name}", numel, src),
                        (f"fp8.param_columnwise_scale_inv.{t.name}", col, src)]
                continue
            src = f"{TE_FP8}/module/base.py: get_weight_workspace (cache_name 'weight', both usages)"
            out += [(f"fp8.weight_cache.{t.name}", numel, src), (f"fp8.weight_cache_columnwise.{t.name}", numel, src),
                    (f"fp8.weight_cache_scale_inv.{t.name}", row, src),
                    (f"fp8.weight_cache_columnwise_scale_inv.{t.name}", col, src)]
            continue
        if param_gather:
            if needs_transpose(sm):
                out.append((f"fp8.transpose.{t.name}", numel, f"{TE_FP8}/tensor/storage/float8_tensor_storage.py: "
                            "update_usage → _create_transpose (kept: Megatron fp8_utils.py post_all_gather_processing)"))
            continue
        src = f"{TE_FP8}/module/base.py: get_weight_workspace (cache_name 'weight')"
        out.append((f"fp8.weight_cache.{t.name}", numel, src))
        if needs_transpose(sm):
            out.append((f"fp8.weight_cache_transpose.{t.name}", numel, src))
        out.append((f"fp8.weight_cache_scale_inv.{t.name}", 4, src))
    return out


#: a parameter's projection → the Megatron-Core TE module that holds it (the graph names parameters by their
#: projection: q/k/v are one ``linear_qkv``, gate and up one ``linear_fc1``, MLA's split up-projections one each)
TE_MODULE = {"q_proj": "linear_qkv", "k_proj": "linear_qkv", "v_proj": "linear_qkv", "o_proj": "linear_proj",
             "gate_proj": "linear_fc1", "up_proj": "linear_fc1", "down_proj": "linear_fc2",
             "q_a_proj": "linear_q_down_proj", "q_b_proj": "linear_q_up_proj", "kv_a_proj": "linear_kv_down_proj",
             "kv_b_proj": "linear_kv_up_proj"}


def te_module(name: str, *, grouped_experts: bool) -> str:
    """The TE module of a TE linear weight ``name``: its projection mapped by :data:`TE_MODULE`, and under
    grouped GEMM (``TEGroupedLinear``) a layer's local experts' projections one module."""
    parts = name.removesuffix(".weight").split(".")
    for i, part in enumerate(parts):
        if part in TE_MODULE:
            head = parts[:i]
            if grouped_experts and len(head) >= 2 and head[-2] == "experts":
                head = head[:-1]
            return ".".join([*head, TE_MODULE[part]])
    return ".".join(parts)


def amax_histories(tensors: Sequence[ParamTensor], *, history: int,
                   grouped_experts: bool) -> list[tuple[str, int, str]]:
    """(name, bytes, source) of the delayed recipe's per-module FP8 state one device holds: one GEMM per TE
    module of the decoder layers' TE linear weights (:func:`te_module`), a grouped module's GEMMs its local
    experts."""
    gemms: dict[str, set[str]] = {}
    for t in tensors:
        if is_te_linear_weight(t.name, t.shape):
            module = te_module(t.name, grouped_experts=grouped_experts)
            expert = t.name.split(".experts.", 1)[1].split(".", 1)[0] if ".experts." in t.name else ""
            gemms.setdefault(module, set()).add(expert)
    out = []
    src = f"{TE_FP8}/fp8.py: DelayedScalingRecipeState (module/base.py: set_meta_tensor)"
    for module, members in gemms.items():
        for mode, per_gemm in (("fwd", 3), ("bwd", 2)):
            q = len(members) * per_gemm
            out.append((f"fp8.amax_history.{module}.{mode}", history * q * 4, src))
            out.append((f"fp8.scale.{module}.{mode}", q * 4, src))
    return out
