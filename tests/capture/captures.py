"""Tiny models for the capture tests: configs, a plain-module factory, and a capture-to-run-file helper."""

from __future__ import annotations

from pathlib import Path

#: groundtruth.md §5's small Llama, shrunk (GQA 4/2) so captures stay fast
LLAMA = {"model_type": "llama", "hidden_size": 256, "num_hidden_layers": 2, "num_attention_heads": 4,
         "num_key_value_heads": 2, "intermediate_size": 704, "vocab_size": 1000}
#: groundtruth.md §5's small DeepSeek-V3 (MLA, layer 0 dense, layer 1 MoE with grouped experts)
DSV3 = {"model_type": "deepseek_v3", "hidden_size": 512, "num_hidden_layers": 2, "num_attention_heads": 8,
        "num_key_value_heads": 8, "q_lora_rank": 128, "kv_lora_rank": 64, "qk_nope_head_dim": 64,
        "qk_rope_head_dim": 32, "v_head_dim": 96, "intermediate_size": 1408, "moe_intermediate_size": 256,
        "n_routed_experts": 8, "num_experts_per_tok": 2, "n_shared_experts": 1, "first_k_dense_replace": 1,
        "n_group": 1, "topk_group": 1, "vocab_size": 1000}
#: issue 12's small Qwen3-MoE (2 layers, 16 experts, top-4; GQA 4/2, head_dim 32; every layer MoE)
QWEN3_MOE = {"model_type": "qwen3_moe", "hidden_size": 128, "num_hidden_layers": 2, "num_attention_heads": 4,
             "num_key_value_heads": 2, "head_dim": 32, "intermediate_size": 384, "moe_intermediate_size": 96,
             "num_experts": 16, "num_experts_per_tok": 4, "decoder_sparse_step": 1, "norm_topk_prob": True,
             "vocab_size": 1000}
B, S = 2, 64

#: the run's sections after [model]: one micro-batch, one iteration, no optimizer step, ideal allocator, no
#: cuBLAS workspaces (the CPU runs these captures are measured against have none)
RUN_TAIL = """\
[training]
micro_batch_size = {b}
seq_len = {s}
num_microbatches = 1
iterations = 1
grad_dtype = "bf16"
master_dtype = "bf16"
optimizer_step = false
[allocator]
kind = "ideal"
[framework]
workspaces = false
"""
RUN = """\
[model]
trace = "{trace}"
profile = "hf"
""" + RUN_TAIL


def capture_config(config: dict, path: Path, b: int = B, s: int = S) -> Path:
    from timeline.capture.hf import hf_builder
    from timeline.capture.run import capture
    from timeline.io.trace_file import write_trace

    prov = {"config": config, "micro_batch_size": b, "seq_len": s, "dtype": "bf16", "name": path.stem,
            "capture_args": "--hf-config config.json", "hidden_size": config["hidden_size"]}
    write_trace(capture(hf_builder(config, micro_batch_size=b, seq_len=s), provenance=prov), path)
    run = path.with_suffix(".toml")
    run.write_text(RUN.format(trace=path.name, b=b, s=s))
    return run


def memtracker_peak(config: dict, groups: list[list[int]] = ()) -> int:
    """PyTorch's own peak (MemTracker) of the fake step the capture records; each group of decoder
    layers runs as one non-reentrant ``torch.utils.checkpoint`` (the others unchanged)."""
    import torch
    from torch.distributed._tools.mem_tracker import MemTracker

    from timeline.capture.gpu import gpu_kernels
    from timeline.capture.hf import hf_builder
    from timeline.capture.run import fake_cpu, training_step

    with fake_cpu(), gpu_kernels():
        model, args, kwargs = hf_builder(config, micro_batch_size=B, seq_len=S)()
        for g in groups:
            _checkpoint_group([model.model.layers[i] for i in g])
        mt = MemTracker()
        mt.track_external(model)
        with mt:
            training_step(model, args, kwargs)
        return int(mt.get_tracker_snapshot("peak")[torch.device("cpu")]["Total"])


def _checkpoint_group(layers: list) -> None:
    """The first layer runs the whole group under one checkpoint; the others hand its output on."""
    from torch.utils.checkpoint import checkpoint

    forwards = [ly.forward for ly in layers]
    out: dict[str, object] = {}

    def chain(x, *args, **kwargs):
        for f in forwards:
            x = f(x, *args, **kwargs)
        return x

    def first(x, *args, **kwargs):
        y = checkpoint(chain, x, *args, use_reentrant=False, **kwargs)
        if len(layers) == 1:
            return y
        out["y"] = y  # handed to the group's last layer, which drops this reference
        return x

    def middle(x, *args, **kwargs):
        return x

    def last(x, *args, **kwargs):
        return out.pop("y")

    layers[0].forward = first
    for ly in layers[1:-1]:
        ly.forward = middle
    if len(layers) > 1:
        layers[-1].forward = last


def tiny_factory():
    """A plain module with two ``layers.N`` blocks, for ``--module captures:tiny_factory``."""
    import torch

    class Block(torch.nn.Module):
        def __init__(self, h: int) -> None:
            super().__init__()
            self.fc = torch.nn.Linear(h, h)

        def forward(self, x: torch.Tensor) -> torch.Tensor:
            return x + torch.relu(self.fc(x))

    class Tiny(torch.nn.Module):
        def __init__(self, layers: int = 2, h: int = 32) -> None:
            super().__init__()
            self.layers = torch.nn.ModuleList(Block(h) for _ in range(layers))

        def forward(self, x: torch.Tensor) -> torch.Tensor:
            for layer in self.layers:
                x = layer(x)
            return x

    return Tiny(), (torch.randn(2, 8, 32),)


def flat_factory():
    """A module without decoder layers."""
    import torch

    return torch.nn.Linear(4, 4), (torch.randn(2, 4),)


def shared_cache_factory():
    """Two ``layers.N`` blocks sharing one rotary-style module whose cache the first layer builds
    and every later layer reads (one module registered in each layer), with a ``trunc_normal_``
    init (it reads a scalar with ``.item()``), in fp32."""
    import torch

    class Shared(torch.nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.cache = None

        def forward(self, x: torch.Tensor) -> torch.Tensor:
            if self.cache is None:
                self.cache = torch.cos(torch.arange(x.shape[-1], dtype=x.dtype))
            return x * self.cache

    class Block(torch.nn.Module):
        def __init__(self, h: int, shared: Shared) -> None:
            super().__init__()
            self.fc = torch.nn.Linear(h, h)
            torch.nn.init.trunc_normal_(self.fc.weight, std=0.02)
            self.rope = shared

        def forward(self, x: torch.Tensor) -> torch.Tensor:
            return x + torch.relu(self.fc(self.rope(x)))

    class Model(torch.nn.Module):
        def __init__(self, layers: int = 3, h: int = 32) -> None:
            super().__init__()
            shared = Shared()
            self.layers = torch.nn.ModuleList(Block(h, shared) for _ in range(layers))

        def forward(self, x: torch.Tensor) -> torch.Tensor:
            for layer in self.layers:
                x = layer(x)
            return x

    return Model(), (torch.randn(2, 8, 32, requires_grad=False),)


def data_dependent_init_factory():
    """A module whose construction runs a data-dependent op (``nonzero``) on a fake tensor."""
    import torch

    w = torch.ones(4)
    keep = torch.nonzero(w)  # noqa: F841 — its output shape depends on values
    return torch.nn.Linear(4, 4), (torch.randn(2, 4),)
