"""CS336 ``BasicsTransformerLM`` in plain PyTorch, op for op, and ``--step`` functions that rebuild
the scripts behind the real snapshots in ``../shared/snapshots/``.

The model follows ``cs336-basics/cs336_basics/model.py`` and ``nn_utils.py`` at
Wedsonlin/assignment2-systems@8630bcf (the course's reference code): einops' ``einsum`` and
``rearrange`` are written as the ``torch.einsum`` calls, views and transposes they produce; RMSNorm
upcasts to fp32; RoPE's cos/sin cache is a buffer shared by every attention (one module registered
in each layer); attention is the course's own (scores, ``where`` mask, max-subtracted softmax);
SwiGLU ``w2(silu(w1 x) * w3 x)`` with ``silu = x * sigmoid(x)``; untied head; the course's
``cross_entropy`` (its own ``log_softmax``, ``gather``, ``mean``) and AdamW (``optimizer.py``: new
``m``/``v`` tensors each step).
"""

from __future__ import annotations

import math
from collections.abc import Callable, Iterable

import torch
import torch.nn as nn


class Linear(nn.Module):
    def __init__(self, d_in: int, d_out: int) -> None:
        super().__init__()
        std = math.sqrt(2 / (d_in + d_out))
        self.weight = nn.Parameter(nn.init.trunc_normal_(torch.empty(d_out, d_in), std=std, a=-3 * std, b=3 * std))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return torch.einsum("...i,oi->...o", x, self.weight)


class Embedding(nn.Module):
    def __init__(self, vocab_size: int, d_model: int) -> None:
        super().__init__()
        self.weight = nn.Parameter(nn.init.trunc_normal_(torch.empty(vocab_size, d_model), std=1.0, a=-3, b=3))

    def forward(self, token_ids: torch.Tensor) -> torch.Tensor:
        return self.weight[token_ids, :]


class RMSNorm(nn.Module):
    def __init__(self, hidden_size: int, eps: float = 1e-5) -> None:
        super().__init__()
        self.weight = nn.Parameter(torch.ones(hidden_size))
        self.eps = eps

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        in_dtype = x.dtype
        x = x.to(torch.float32)
        rms = torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + self.eps)
        x = x * rms
        return (self.weight * x).to(in_dtype)


class RotaryEmbedding(nn.Module):
    def __init__(self, context_length: int, dim: int, theta: float = 10000.0) -> None:
        super().__init__()
        d = torch.arange(0, dim, 2) / dim
        freqs = torch.tensor(theta) ** -d
        t = torch.arange(context_length)
        freqs = torch.einsum("t,f->tf", t, freqs)
        self.register_buffer("_freq_cis_cache", torch.stack((torch.cos(freqs), torch.sin(freqs))), persistent=False)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        # rearrange(x, "... (half_d xy) -> xy ... half_d", xy=2).unbind(0)
        *lead, d = x.shape
        x1, x2 = x.reshape(*lead, d // 2, 2).permute(-1, *range(len(lead) + 1)).unbind(0)
        cos, sin = self._freq_cis_cache[:, : x.size(-2), :].unbind(0)
        x1_rot = cos * x1 - sin * x2
        x2_rot = sin * x1 + cos * x2
        return torch.concat((x1_rot, x2_rot), dim=-1)


def softmax(x: torch.Tensor, dim: int = -1) -> torch.Tensor:
    rescaled = x - torch.max(x, dim=dim, keepdim=True)[0]
    e = torch.exp(rescaled)
    return e / torch.sum(e, dim=dim, keepdim=True)


def log_softmax(x: torch.Tensor, dim: int = -1) -> torch.Tensor:
    x_max = torch.max(x, dim=dim, keepdim=True)[0]
    x = x - x_max
    return x - torch.log(torch.sum(torch.exp(x), dim=dim, keepdim=True))


def cross_entropy(inputs: torch.Tensor, targets: torch.Tensor) -> torch.Tensor:
    return torch.mean(torch.gather(-log_softmax(inputs), -1, targets.unsqueeze(-1)))


def attention(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
    scores = torch.einsum("...qd,...kd->...qk", q, k) / math.sqrt(k.shape[-1])
    scores = torch.where(mask, scores, float("-inf"))
    return torch.einsum("...qk,...kd->...qd", softmax(scores, dim=-1), v)


class CausalMultiHeadSelfAttention(nn.Module):
    def __init__(self, d_model: int, num_heads: int, rope: RotaryEmbedding) -> None:
        super().__init__()
        self.num_heads = num_heads
        self.q_proj, self.k_proj, self.v_proj = (Linear(d_model, d_model) for _ in range(3))
        self.output_proj = Linear(d_model, d_model)
        self.positional_encoder = rope

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        *batch, s, d = x.size()
        q, k, v = (p(x).view(*batch, s, self.num_heads, d // self.num_heads).transpose(-3, -2)
                   for p in (self.q_proj, self.k_proj, self.v_proj))
        q, k = self.positional_encoder(q), self.positional_encoder(k)
        iota = torch.arange(s, device=x.device)
        mask = (iota.view(s, 1) >= iota.view(1, s))[(None,) * len(batch) + (...,)]
        out = attention(q, k, v, mask)
        out = out.transpose(-3, -2).reshape(*batch, s, d).contiguous()
        return self.output_proj(out)


class SwiGLU(nn.Module):
    def __init__(self, d_model: int, d_ff: int) -> None:
        super().__init__()
        self.w1, self.w2, self.w3 = Linear(d_model, d_ff), Linear(d_ff, d_model), Linear(d_model, d_ff)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        a = self.w1(x)
        return self.w2(a * torch.sigmoid(a) * self.w3(x))


class TransformerBlock(nn.Module):
    def __init__(self, d_model: int, num_heads: int, d_ff: int, rope: RotaryEmbedding) -> None:
        super().__init__()
        self.attn = CausalMultiHeadSelfAttention(d_model, num_heads, rope)
        self.ffn = SwiGLU(d_model, d_ff)
        self.ln1, self.ln2 = RMSNorm(d_model), RMSNorm(d_model)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = x + self.attn(self.ln1(x))
        return x + self.ffn(self.ln2(x))


class BasicsTransformerLM(nn.Module):
    def __init__(self, vocab_size: int, context_length: int, d_model: int, num_layers: int, num_heads: int,
                 d_ff: int, rope_theta: float = 10_000.0) -> None:
        super().__init__()
        self.token_embeddings = Embedding(vocab_size, d_model)
        self.positional_encoder = RotaryEmbedding(context_length, d_model // num_heads, rope_theta)
        self.layers = nn.ModuleList([TransformerBlock(d_model, num_heads, d_ff, self.positional_encoder)
                                     for _ in range(num_layers)])
        self.ln_final = RMSNorm(d_model)
        self.lm_head = Linear(d_model, vocab_size)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = self.token_embeddings(x)
        for layer in self.layers:
            x = layer(x)
        return self.lm_head(self.ln_final(x))


class AdamW(torch.optim.Optimizer):
    """``cs336_basics/optimizer.py``'s AdamW: new m and v tensors every step."""

    def __init__(self, params: Iterable[nn.Parameter], lr: float = 1e-3, betas=(0.9, 0.999), eps: float = 1e-8,
                 weight_decay: float = 0.01) -> None:
        super().__init__(params, dict(lr=lr, betas=betas, eps=eps, weight_decay=weight_decay))

    def step(self, closure: Callable | None = None):
        for group in self.param_groups:
            for p in group["params"]:
                if p.grad is None:
                    continue
                grad = p.grad.data
                state = self.state[p]
                alpha = group["lr"]
                beta_1, beta_2 = group["betas"]
                t = state.get("t", 1)
                alpha_t = alpha * (math.sqrt(1 - (beta_2**t)) / (1 - (beta_1**t)))
                p.data -= alpha * group["weight_decay"] * p.data
                prev_m = state.get("m", torch.zeros_like(grad))
                prev_v = state.get("v", torch.zeros_like(grad))
                m_t = beta_1 * prev_m + ((1 - beta_1) * grad)
                v_t = beta_2 * prev_v + ((1 - beta_2) * torch.square(grad))
                p.data -= alpha_t * m_t / (torch.sqrt(v_t) + group["eps"])
                state["m"], state["v"], state["t"] = m_t, v_t, t + 1
        return None


# -- the scripts behind the snapshots, as --step functions --------------------------------------

def _batch(vocab: int, shape: tuple[int, ...]) -> torch.Tensor:
    return torch.randint(0, vocab, shape, dtype=torch.long, device="cuda")


def wedsonlin(context_length: int, autocast: bool) -> Callable[[], None]:
    """``cs336_systems/nsys_profile.py`` ``memory_profile(pattern="full-training-step")`` at
    Wedsonlin/assignment2-systems@8630bcf for the medium model: 5 warm-up steps (forward + loss
    under ``torch.autocast("cuda", bf16, enabled=autocast)``, backward, the course's AdamW step,
    ``zero_grad()``; ``output`` and ``loss`` stay bound between iterations), then ``del output,
    loss``, ``zero_grad(set_to_none=True)`` and the recorded step (no ``zero_grad`` after it).
    Call 6 is the recorded one."""
    model = BasicsTransformerLM(10_000, context_length, 1024, 24, 16, 4096)
    model.to(torch.device("cuda"))
    optimizer = AdamW(model.parameters())
    warmup_inputs, warmup_targets = _batch(10_000, (5, 4, context_length)), _batch(10_000, (5, 4, context_length))
    execution_inputs = _batch(10_000, (1, 4, context_length))
    execution_targets = _batch(10_000, (1, 4, context_length))
    held: dict[str, torch.Tensor] = {}
    calls = [0]

    def step() -> None:
        i = calls[0]
        calls[0] += 1
        if i == 5:
            held.clear()  # del output, loss
            optimizer.zero_grad(set_to_none=True)
        x, y = (warmup_inputs[i], warmup_targets[i]) if i < 5 else (execution_inputs[0], execution_targets[0])
        with torch.autocast(device_type="cuda", dtype=torch.bfloat16, enabled=autocast):
            held["output"] = model(x)
            held["loss"] = cross_entropy(held["output"], y)
        held["loss"].backward()
        optimizer.step()
        if i < 5:
            optimizer.zero_grad()

    return step


def wedsonlin_medium_128() -> Callable[[], None]:
    return wedsonlin(128, autocast=False)


def wedsonlin_medium_512() -> Callable[[], None]:
    return wedsonlin(512, autocast=True)


def magma27() -> Callable[[], None]:
    """``cs336_systems/benchmarking_script.py`` at MAGMA27/assignment2-systems@15883f2: the small
    model (d 768, 12 layers, batch 32, ctx 256, fp32), 5 warm-up forward + loss + backward passes
    with no ``zero_grad`` (gradients accumulate; ``lm_head`` and ``loss`` stay bound between
    iterations), then the recorded one, the same."""
    model = BasicsTransformerLM(10_000, 256, 768, 12, 12, 3072, 10_000).to("cuda")
    data = torch.randint(0, 10_000, (32, 256)).to("cuda")
    target = torch.randint(0, 10_000, (32, 256)).to("cuda")
    held: dict[str, torch.Tensor] = {}

    def step() -> None:
        held["lm_head"] = model(data)
        held["loss"] = cross_entropy(held["lm_head"], target)
        held["loss"].backward()
        torch.cuda.synchronize()

    return step


def tiny_torch_adamw() -> Callable[[], None]:
    """A 2-layer model and ``torch.optim.AdamW`` (defaults: foreach on CUDA), the loop every
    PyTorch tutorial writes: forward, loss, backward, step, ``zero_grad()`` (set_to_none)."""
    model = BasicsTransformerLM(100, 16, 32, 2, 4, 64).cuda()
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-3)
    x = torch.randint(0, 100, (2, 16), device="cuda")

    def step() -> None:
        loss = cross_entropy(model(x), x)
        loss.backward()
        optimizer.step()
        optimizer.zero_grad()
        torch.cuda.synchronize()
        torch.cuda.reset_peak_memory_stats()

    return step


def cuda_graph_step() -> Callable[[], None]:
    """A step capturing a CUDA graph, whose private memory pool the stand-in does not model."""
    model = Linear(4, 4).to("cuda")

    def step() -> None:
        graph = torch.cuda.CUDAGraph()
        with torch.cuda.graph(graph):
            model(torch.ones(2, 4, device="cuda")).sum().backward()

    return step


def item_in_step() -> Callable[[], None]:
    model = Linear(4, 4).to("cuda")

    def step() -> None:
        y = model(torch.ones(2, 4, device="cuda")).sum()
        if y.item() > 0:
            y.backward()

    return step
