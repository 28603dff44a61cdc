"""Ground truth: what real PyTorch autograd saves for one training step of a Hugging Face causal LM.

Builds the model from a config dict (random init, nothing downloaded) on the CPU, by default under
``FakeTensorMode`` (no data, exact shapes), and measures — as ``../shared/reference/groundtruth.md``
§2–3 describes — the storages autograd keeps from forward to backward: every tensor a
``saved_tensors_hooks`` pack hook sees, de-duplicated by storage (parameters, buffers and token ids
excluded), plus storages still alive after the forward that never went through the hooks (a
checkpoint's kept inputs). Each storage is attributed to the decoder layer that first saved it
(or, for a checkpoint input, the checkpointed layer; -1 outside decoder layers), the module and
aten op that created it, and the autograd node attributes holding it (``MmBackward0._saved_self``).
``MemTracker`` gives the Activation bytes after forward (must equal the sum) and the step's peak.

CPU-vs-GPU fixes applied (groundtruth.md §3): SDPA emulated with the flash kernel (no mask, equal
head dims ≤ 256, 16-bit; GQA at kv-head width) else the memory-efficient kernel (fake mode only),
training dropout through ``native_dropout`` (1-byte masks), 16-bit LayerNorm keeping fp32 mean/rstd as
the CUDA kernel does (fake mode only), no packed-sequence mask, ``use_cache=False``. A model class without SDPA support (GPT-OSS, whose sinks need
the logits) runs its default, eager attention.
Not measured: CUDA allocator rounding, workspaces, RNG state of a checkpoint (see §6).

Usage: ``python tools/groundtruth.py CONFIG.json [--seq-len S] [--micro-batch B] [--recompute full]``
prints JSON. Importing this module imports neither torch nor transformers.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

DTYPES = {"bf16": "bfloat16", "fp16": "float16", "fp32": "float32"}


def _key(t: Any) -> int:
    return t.untyped_storage()._cdata


@contextlib.contextmanager
def gpu_like(fake: bool) -> Iterator[None]:
    """Patch SDPA, dropout and the packed-sequence check so the CPU saves what a GPU saves."""
    import torch
    import torch.nn.functional as F
    import transformers.masking_utils as mu

    orig_sdpa, orig_drop, orig_packed = F.scaled_dot_product_attention, F.dropout, mu.find_packed_sequence_indices

    def sdpa(q, k, v, attn_mask=None, dropout_p=0.0, is_causal=False, scale=None, enable_gqa=False):
        flash = attn_mask is None and q.shape[-1] == v.shape[-1] <= 256 and q.dtype in (torch.bfloat16, torch.float16)
        if flash:  # CUDA's flash backend takes GQA natively: k/v stay at kv-head width
            return torch.ops.aten._scaled_dot_product_flash_attention(q, k, v, dropout_p, is_causal, False,
                                                                       scale=scale)[0]
        if k.shape[1] != q.shape[1]:
            k = k.repeat_interleave(q.shape[1] // k.shape[1], dim=1)
            v = v.repeat_interleave(q.shape[1] // v.shape[1], dim=1)
        return torch.ops.aten._scaled_dot_product_efficient_attention(q, k, v, attn_mask, True, dropout_p,
                                                                       is_causal, scale=scale)[0]

    def dropout(x, p=0.5, training=True, inplace=False):
        # ``inplace`` stays for F.dropout's signature (nn.Dropout passes it positionally); the saved
        # mask is the same either way
        if training and p > 0:
            return torch.native_dropout(x, p, True)[0]
        return x

    class LayerNorm(torch.autograd.Function):
        """``native_layer_norm`` keeping fp32 mean/rstd as CUDA does (the CPU kernel casts them to a
        16-bit input's dtype: torch/_refs ``native_layer_norm``)."""

        @staticmethod
        def forward(ctx, x, shape, weight, bias, eps):
            out, mean, rstd = torch.native_layer_norm(x, shape, weight, bias, eps)
            mean, rstd = mean.float(), rstd.float()
            ctx.shape = shape
            ctx.save_for_backward(x, weight, bias, mean, rstd)
            return out

        @staticmethod
        def backward(ctx, grad):
            x, weight, bias, mean, rstd = ctx.saved_tensors
            mask = [ctx.needs_input_grad[0], weight is not None, bias is not None]
            dx, dw, db = torch.ops.aten.native_layer_norm_backward(grad, x, ctx.shape, mean.to(x.dtype),
                                                                   rstd.to(x.dtype), weight, bias, mask)
            return dx, None, dw, db, None

    def layer_norm(x, normalized_shape, weight=None, bias=None, eps=1e-5):
        if x.dtype in (torch.bfloat16, torch.float16):
            return LayerNorm.apply(x, list(normalized_shape), weight, bias, eps)
        return orig_ln(x, normalized_shape, weight, bias, eps)

    orig_ln = F.layer_norm
    if fake:
        F.scaled_dot_product_attention = sdpa
        F.layer_norm = layer_norm
    F.dropout = dropout
    mu.find_packed_sequence_indices = lambda _position_ids: None  # no packed sequences: one mask for all
    try:
        yield
    finally:
        F.scaled_dot_product_attention, F.dropout, F.layer_norm = orig_sdpa, orig_drop, orig_ln
        mu.find_packed_sequence_indices = orig_packed


def _creator_mode(stack: list[str], created: dict[int, dict[str, Any]]):
    """A dispatch mode recording, per output storage, the aten op and module that created it."""
    import torch
    from torch.multiprocessing.reductions import StorageWeakRef
    from torch.utils._python_dispatch import TorchDispatchMode
    from torch.utils._pytree import tree_flatten

    class Creators(TorchDispatchMode):
        def __torch_dispatch__(self, func, types, args=(), kwargs=None):
            out = func(*args, **(kwargs or {}))
            for t in tree_flatten(out)[0]:
                if isinstance(t, torch.Tensor):
                    k = _key(t)
                    old = created.get(k)
                    if old is None or old["ref"].expired():
                        created[k] = {"ref": StorageWeakRef(t.untyped_storage()), "op": str(func.overloadpacket),
                                      "module": stack[-1] if stack else "", "bytes": t.untyped_storage().nbytes(),
                                      "dtype": str(t.dtype).removeprefix("torch."), "shape": list(t.shape)}
            return out

    return Creators()


def _layer_of(module: str) -> int:
    parts = module.split(".")
    for i, p in enumerate(parts[:-1]):
        if p in ("layers", "h") and parts[i + 1].isdigit():  # GPT-2: transformer.h.N
            return int(parts[i + 1])
    return -1


def _nodes(root: Any) -> dict[int, list[str]]:
    """Storage -> ``Node._saved_attr`` names, walking the autograd graph from ``root``."""
    import torch

    found: dict[int, list[str]] = {}
    seen: set[int] = set()
    todo = [root]
    while todo:
        n = todo.pop()
        if n is None or id(n) in seen:
            continue
        seen.add(id(n))
        for attr in dir(n):
            if attr.startswith("_saved_"):
                vals = getattr(n, attr)
                for v in vals if isinstance(vals, tuple | list) else (vals,):
                    if isinstance(v, torch.Tensor):
                        found.setdefault(_key(v), []).append(f"{n.name()}.{attr[7:]}")
        todo += [f for f, _ in n.next_functions]
    return found


def build(config: dict[str, Any], dtype: str) -> Any:
    """The causal LM of ``config`` (a config.json dict) in ``dtype``, SDPA attention, grouped_mm experts."""
    import torch
    from transformers import AutoModelForCausalLM
    from transformers.models.auto.configuration_auto import CONFIG_MAPPING

    cfg = dict(config)
    cfg_cls = CONFIG_MAPPING[cfg.pop("model_type", "llama")]
    hf = cfg_cls(**cfg)
    hf.use_cache = False
    from transformers.models.auto.modeling_auto import MODEL_FOR_CAUSAL_LM_MAPPING as CLASSES

    attn = "sdpa" if CLASSES[type(hf)]._supports_sdpa else "eager"  # GPT-OSS: eager (sinks need the logits)
    kw: dict[str, Any] = {"attn_implementation": attn, "dtype": getattr(torch, DTYPES[dtype])}
    if cfg.get("n_routed_experts") or cfg.get("num_local_experts") or cfg.get("num_experts"):
        kw["experts_implementation"] = "grouped_mm"
    model = AutoModelForCausalLM.from_config(hf, **kw)
    model.train()
    return model


def decoder_layers(model: Any) -> Any:
    """The decoder layers of a causal LM: ``model.model.layers``, GPT-2's ``transformer.h``, OPT's
    ``model.decoder.layers``."""
    base = getattr(model, "model", None) or model.transformer
    base = getattr(base, "decoder", base)
    return base.layers if hasattr(base, "layers") else base.h


def measure(config: dict[str, Any], *, seq_len: int, micro_batch: int, dtype: str = "bf16",
            recompute: str = "none", fake: bool = True, peak: bool = True) -> dict[str, Any]:
    """Saved bytes per decoder layer (and by tensor) for one forward + backward of ``config``.

    ``recompute``: ``none`` or ``full`` (each decoder layer under non-reentrant ``checkpoint``).
    Returns ``{"layers": {layer: bytes}, "tensors": [...], "total": int, "memtracker": {...}}``.
    """
    import torch
    from torch._subclasses.fake_tensor import FakeTensorMode
    from torch.distributed._tools.mem_tracker import MemTracker
    from torch.utils._pytree import tree_flatten
    from torch.utils.checkpoint import checkpoint

    stack: list[str] = []
    created: dict[int, dict[str, Any]] = {}
    saved: dict[int, dict[str, Any]] = {}
    ckpt_inputs: dict[int, int] = {}
    phase = {"forward": True}
    with contextlib.ExitStack() as es:
        es.enter_context(gpu_like(fake))
        if fake:
            es.enter_context(FakeTensorMode(allow_non_fake_inputs=True))
        model = build(config, dtype)
        ids = torch.randint(0, model.config.vocab_size, (micro_batch, seq_len))
        excluded = {_key(p) for p in (*model.parameters(), *model.buffers(), ids)}
        def enter(name: str) -> None:
            if phase["forward"]:
                stack.append(name)

        def leave() -> None:  # a forward hook returning a value would replace the module's output
            if phase["forward"]:
                stack.pop()

        for name, mod in model.named_modules():
            mod.register_forward_pre_hook(lambda m, a, n=name: enter(n))
            mod.register_forward_hook(lambda m, a, o: leave())
        if recompute == "full":
            for i, layer in enumerate(decoder_layers(model)):
                def ckpt(*args, _fwd=layer.forward, _i=i, **kw):
                    # the hidden states (first argument) count to the layer; the shared RoPE cos/sin and
                    # position ids a checkpoint also keeps count outside layers (-1), as groundtruth.md §5
                    for j, t in enumerate(tree_flatten((args, kw))[0]):
                        if isinstance(t, torch.Tensor) and phase["forward"]:
                            ckpt_inputs.setdefault(_key(t), _i if j == 0 else -1)
                    return checkpoint(_fwd, *args, use_reentrant=False, **kw)
                layer.forward = ckpt
        elif recompute != "none":
            raise ValueError(f"recompute {recompute!r}: use none or full")

        def pack(t: torch.Tensor) -> torch.Tensor:
            k = _key(t)
            if k not in excluded and (k not in saved or saved[k]["ref"].expired()):
                from torch.multiprocessing.reductions import StorageWeakRef
                saved[k] = {"ref": StorageWeakRef(t.untyped_storage()), "module": stack[-1] if stack else "",
                            "bytes": t.untyped_storage().nbytes(), "dtype": str(t.dtype).removeprefix("torch."),
                            "shape": list(t.shape)}
            return t

        tracker = MemTracker() if peak else None
        if tracker:
            tracker.track_external(model, ids)
            es.enter_context(tracker)
        es.enter_context(_creator_mode(stack, created))
        with torch.autograd.graph.saved_tensors_hooks(pack, lambda t: t):
            loss = model(input_ids=ids, labels=ids, use_cache=False).loss
        phase["forward"] = False
        after_fwd = dict(tracker.get_tracker_snapshot("current")) if tracker else {}
        nodes = _nodes(loss.grad_fn) if recompute == "none" else {}
        tensors = _collect(saved, created, ckpt_inputs, excluded | {_key(loss)}, nodes)
        loss.backward()
        out: dict[str, Any] = {"tensors": tensors}
        if tracker:
            dev = next(iter(after_fwd))
            out["memtracker"] = {"activation_after_forward": after_fwd[dev].get("Activation", 0),
                                 "peak": tracker.get_tracker_snapshot("peak")[dev]["Total"]}
    layers: dict[int, int] = {}
    for t in tensors:
        layers[t["layer"]] = layers.get(t["layer"], 0) + t["bytes"]
    out["layers"] = dict(sorted(layers.items()))
    out["total"] = sum(layers.values())
    return out


def _collect(saved: dict, created: dict, ckpt_inputs: dict[int, int], excluded: set[int],
             nodes: dict[int, list[str]]) -> list[dict[str, Any]]:
    """Live saved storages, plus live never-hooked ones (checkpoint inputs), one record each."""
    out = []
    for k, info in created.items():
        if k in excluded or info["ref"].expired():
            continue
        s = saved.get(k)
        if s is not None and s["ref"].expired():
            s = None
        if s is None and k not in ckpt_inputs:
            continue  # alive but not kept for backward (held elsewhere, e.g. a cache)
        src = s or info
        out.append({"layer": _layer_of(s["module"]) if s else ckpt_inputs[k], "bytes": src["bytes"],
                    "module": s["module"] if s else "checkpoint", "creator": f"{info['module']}:{info['op']}",
                    "dtype": src["dtype"], "shape": src["shape"], "nodes": nodes.get(k, [])})
    return out


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("config", type=Path, help="a Hugging Face config.json")
    ap.add_argument("--seq-len", type=int, default=512)
    ap.add_argument("--micro-batch", type=int, default=2)
    ap.add_argument("--dtype", choices=sorted(DTYPES), default="bf16")
    ap.add_argument("--recompute", choices=("none", "full"), default="none")
    ap.add_argument("--real", action="store_true", help="real CPU tensors instead of fake ones (slow)")
    ap.add_argument("--tensors", action="store_true", help="list every saved storage")
    args = ap.parse_args(argv)
    res = measure(json.loads(args.config.read_text()), seq_len=args.seq_len, micro_batch=args.micro_batch,
                  dtype=args.dtype, recompute=args.recompute, fake=not args.real)
    if not args.tensors:
        res.pop("tensors")
    json.dump(res, sys.stdout, indent=1)
    print()
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
