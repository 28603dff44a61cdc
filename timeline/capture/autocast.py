"""CUDA autocast on the CPU capture: ``torch.autocast("cuda", …)`` as a GPU runs it.

On a CPU-only PyTorch, a CUDA autocast region changes nothing for CPU (fake) tensors: the
``AutocastCUDA`` dispatch key only sees CUDA tensors. While such a region is active this module
turns on CPU autocast with the region's dtype and replaces the ``AutocastCPU`` kernels with CUDA's
policies, op by op, at the same place in the dispatcher (above autograd, so every cast is
recorded and saved as on a GPU):

- the op lists are ``aten/src/ATen/autocast_mode.cpp`` ``TORCH_LIBRARY_IMPL(aten, AutocastCUDA, m)``
  (``AT_FORALL_LOWER_PRECISION_FP``, ``AT_FORALL_FP32``, ``AT_FORALL_FP32_SET_OPT_DTYPE``,
  ``AT_FORALL_DIFFERENT_REDISPATCH_SIGNATURE``, ``AT_FORALL_PROMOTE``, the banned
  ``binary_cross_entropy``); a test pins their union to the ops with an ``AutocastCUDA`` kernel in
  the installed PyTorch;
- ``cached_cast``: a floating tensor argument on the device (not fp64) is cast to the policy's
  dtype; the lower-precision cast of an fp32 leaf that requires grad (a weight) is cached until
  the outermost autocast region exits (``autocast_mode.cpp`` ``get_cached_casts``;
  ``torch/amp/autocast_mode.py`` ``__exit__`` clears it);
- CPU's own autocast ops that CUDA does not autocast fall through.

It does not record (the recorder sees the casts as ordinary ``_to_copy`` ops).
"""

from __future__ import annotations

import contextlib
from collections.abc import Callable, Iterator
from typing import Any

import torch
from torch.utils._pytree import tree_map

#: CUDA's autocast policies at the pinned PyTorch (2.13): op (with overload) → policy
LOWER = ("_convolution", "_convolution.deprecated", "conv1d", "conv2d", "conv3d", "conv_tbc", "conv_transpose1d",
         "conv_transpose2d.input", "conv_transpose3d.input", "convolution", "cudnn_convolution",
         "cudnn_convolution_transpose", "prelu", "addmm", "addmv", "addr", "matmul", "einsum", "mm", "mv",
         "linalg_vecdot", "linear", "addbmm", "baddbmm", "bmm", "chain_matmul", "linalg_multi_dot",
         "_thnn_fused_lstm_cell", "_thnn_fused_gru_cell", "lstm_cell", "gru_cell", "rnn_tanh_cell", "rnn_relu_cell",
         "_scaled_dot_product_flash_attention", "scaled_dot_product_attention")
FP32 = ("acos", "asin", "cosh", "erfinv", "exp", "expm1", "log", "log10", "log2", "log1p", "reciprocal", "rsqrt",
        "sinh", "tan", "pow.Tensor_Scalar", "pow.Tensor_Tensor", "pow.Scalar", "softplus", "layer_norm",
        "native_layer_norm", "group_norm", "frobenius_norm.dim", "nuclear_norm", "nuclear_norm.dim",
        "cosine_similarity", "poisson_nll_loss", "cosine_embedding_loss", "nll_loss", "nll_loss2d",
        "hinge_embedding_loss", "kl_div", "l1_loss", "smooth_l1_loss", "huber_loss", "mse_loss",
        "margin_ranking_loss", "multilabel_margin_loss", "soft_margin_loss", "triplet_margin_loss",
        "multi_margin_loss", "binary_cross_entropy_with_logits", "dist", "pdist", "cdist", "renorm", "logsumexp",
        "upsample_nearest1d", "_upsample_nearest_exact1d", "upsample_nearest2d", "_upsample_nearest_exact2d",
        "upsample_nearest3d", "_upsample_nearest_exact3d", "upsample_linear1d", "upsample_bilinear2d",
        "_upsample_bilinear2d_aa", "upsample_trilinear3d", "upsample_bicubic2d", "_upsample_bicubic2d_aa",
        "rms_norm")
FP32_SET_OPT_DTYPE = ("prod", "prod.dim_int", "softmax.int", "log_softmax.int", "cumprod", "cumsum",
                      "linalg_vector_norm", "linalg_matrix_norm", "linalg_matrix_norm.str_ord", "sum",
                      "sum.dim_IntList")
FP32_APPEND_DTYPE = ("norm.Scalar", "norm.ScalarOpt_dim")
PROMOTE = ("addcdiv", "addcmul", "atan2", "bilinear", "cross", "dot", "vdot", "grid_sampler", "index_put",
           "tensordot", "scatter_add")
BANNED = ("binary_cross_entropy",)


def policies() -> dict[str, str]:
    """``aten::name[.overload]`` → lower | fp32 | fp32_set_opt_dtype | fp32_append_dtype | promote | banned."""
    out: dict[str, str] = {}
    for policy, ops in (("lower", LOWER), ("fp32", FP32), ("fp32_set_opt_dtype", FP32_SET_OPT_DTYPE),
                        ("fp32_append_dtype", FP32_APPEND_DTYPE), ("promote", PROMOTE), ("banned", BANNED)):
        out.update({f"aten::{op}": policy for op in ops})
    return out


class Emulation:
    """The CUDA-autocast kernels, installed at ``AutocastCPU`` for the capture's duration."""

    def __init__(self, is_device: Callable[[torch.Tensor], bool]) -> None:
        self.is_device = is_device  # which tensors live on the (stand-in) GPU
        self.cache: dict[int, tuple[torch.Tensor, torch.Tensor]] = {}
        self.depth = 0
        self.lib: Any = None

    def eligible(self, t: Any) -> bool:
        return isinstance(t, torch.Tensor) and t.is_floating_point() and t.dtype != torch.float64 \
            and self.is_device(t)

    def cast(self, t: Any, dtype: torch.dtype) -> Any:
        if not self.eligible(t) or t.dtype == dtype:
            return t
        lower = dtype == torch.get_autocast_dtype("cpu")
        if lower and t.dtype == torch.float32 and t.requires_grad and t.is_leaf and not t._is_view():
            hit = self.cache.get(id(t))
            if hit is not None and hit[0] is t:
                return hit[1]
            out = t.to(dtype)
            self.cache[id(t)] = (t, out)
            return out
        return t.to(dtype)

    def kernel(self, name: str, policy: str) -> Callable[..., Any]:
        ns, _, rest = name.partition("::")
        op_name, _, overload = rest.partition(".")
        op = getattr(getattr(torch.ops.aten, op_name), overload or "default")
        keys = torch._C.DispatchKeySet(torch._C.DispatchKey.AutocastCPU)
        dtype_at = next((i for i, a in enumerate(op._schema.arguments) if a.name == "dtype"), 1 << 30)

        def run(*args: Any, **kwargs: Any) -> Any:
            with torch._C._ExcludeDispatchKeyGuard(keys):
                if policy == "banned":
                    raise RuntimeError(f"torch.nn.functional.{op_name} is unsafe to autocast (CUDA autocast "
                                       "bans it); use binary_cross_entropy_with_logits")
                if policy in ("lower", "fp32", "fp32_append_dtype"):
                    dtype = torch.get_autocast_dtype("cpu") if policy == "lower" else torch.float32
                    args, kwargs = tree_map(lambda t: self.cast(t, dtype), (args, kwargs))
                elif policy == "promote":
                    flat = [t for t in list(args) + list(kwargs.values()) if self.eligible(t)]
                    if flat:
                        wide = flat[0].dtype
                        for t in flat[1:]:
                            wide = torch.promote_types(wide, t.dtype)
                        args, kwargs = tree_map(lambda t: self.cast(t, wide), (args, kwargs))
                elif policy == "fp32_set_opt_dtype" and args and self.eligible(args[0]):
                    # set_opt_dtype: an unset ``dtype`` becomes fp32 (positional or keyword)
                    if dtype_at < len(args):
                        if args[dtype_at] is None:
                            args = (*args[:dtype_at], torch.float32, *args[dtype_at + 1:])
                    elif kwargs.get("dtype") is None:
                        kwargs = {**kwargs, "dtype": torch.float32}
                return op(*args, **kwargs)

        return run

    def install(self) -> None:
        self.lib = torch.library.Library("aten", "IMPL")
        table = policies()
        names = torch._C._dispatch_get_all_op_names()
        for name, policy in table.items():
            if name in names:
                self.lib.impl(name.removeprefix("aten::"), self.kernel(name, policy), "AutocastCPU")
        for name in names:
            if name.startswith("aten::") and name not in table and \
                    torch._C._dispatch_has_kernel_for_dispatch_key(name, "AutocastCPU"):
                self.lib.impl(name.removeprefix("aten::"), torch.library.fallthrough_kernel, "AutocastCPU")

    def uninstall(self) -> None:
        if self.lib is not None:
            self.lib._destroy()
            self.lib = None


@contextlib.contextmanager
def cuda_autocast(is_device: Callable[[torch.Tensor], bool]) -> Iterator[Emulation]:
    """While active, ``torch.autocast("cuda", …)`` regions autocast the fake device as CUDA would."""
    import warnings

    import torch.amp.autocast_mode as am

    emu = Emulation(is_device)
    real_enter, real_exit = am.autocast.__enter__, am.autocast.__exit__

    def enter(self: am.autocast) -> Any:
        out = real_enter(self)
        if self.device == "cuda":
            # the CPU autocast state this region replaces, kept on the region object itself
            self.__dict__["_timeline_prev"] = (torch.is_autocast_enabled("cpu"), torch.get_autocast_dtype("cpu"))
            torch.set_autocast_enabled("cpu", self._enabled)
            torch.set_autocast_dtype("cpu", self.fast_dtype)
            emu.depth += 1
        return out

    def exit(self: am.autocast, *exc: Any) -> Any:
        if self.device == "cuda":
            enabled, dtype = self.__dict__["_timeline_prev"]
            torch.set_autocast_enabled("cpu", enabled)
            torch.set_autocast_dtype("cpu", dtype)
            emu.depth -= 1
            if emu.depth == 0:
                emu.cache.clear()  # the outermost region's exit clears the weight-cast cache
        return real_exit(self, *exc)

    with warnings.catch_warnings():
        warnings.filterwarnings("ignore", message=".*Overriding a previously registered kernel.*")
        warnings.filterwarnings("ignore", message=".*Warning only once for all operators.*")
        emu.install()
    # monkey-patching the context manager's methods for the capture's duration
    am.autocast.__enter__, am.autocast.__exit__ = enter, exit  # type: ignore[method-assign]
    try:
        yield emu
    finally:
        am.autocast.__enter__, am.autocast.__exit__ = real_enter, real_exit  # type: ignore[method-assign]
        emu.uninstall()
