"""torchtitan's Llama 3 debug model, trained as ``torchtitan/trainer.py`` runs one step on one GPU
(pytorch/torchtitan at b5bcd76c66d0, BSD-3-Clause licence; ``torchtitan/models/llama3/__init__.py:
_debugmodel``, ``config_registry.py: llama3_debugmodel``, ``trainer.py: Trainer.train_step`` /
``_forward_backward_body``, ``components/loss.py: ChunkedLossWrapper``,
``components/optimizer/optimizer.py: default_adamw``, ``distributed/activation_checkpoint.py``).

Reproduced in this file's own words: the debug model's module tree (``tok_embeddings``; ``layers`` a
ModuleDict "0".."5" of blocks with RMSNorm ``attention_norm`` / ``ffn_norm``, attention with one fused
``wqkv`` Linear and ``wo``, each attention owning a RoPE module whose non-persistent complex64 ``cache``
buffer holds ``(max_context_length, head_dim / 2)`` rotations, ``max_context_length`` set to the training
sequence length by ``Decoder.Config.update_from_config`` (its "llama" frequency scaling changes values, not
sizes, and is left out); SwiGLU ``feed_forward`` w1/w2/w3 with hidden 768 =
``compute_ffn_hidden_dim(256, multiple_of=256)``; final ``norm``; untied ``lm_head``), bias-free, dim 256,
16 heads, 6 layers, vocab 2048 — the debug model's real sizes. The step: ``optimizers.zero_grad(set_to_none=
False)`` first (``set_to_none=training.disable_cuda_graphs``, False by default: gradients are zeroed in place
and stay allocated), the single-device mixed precision of ``training.mixed_precision_param = bfloat16``
(``torch.autocast`` when no FSDP), the chunked loss (the decoder's hidden state detached, split in 8 chunks
along the sequence, ``lm_head`` + cross-entropy + ``backward()`` per chunk, then the decoder's backward from
the accumulated hidden-state gradient), ``clip_grad_norm_(1.0)``, and AdamW (lr 8e-4, betas 0.9/0.95,
weight decay 0.1, eps 1e-8) with the optimizer container's default ``implementation = "fused"``.
``torchtitan_llama3_full_ac`` wraps every block in non-reentrant activation checkpointing, as
``FullAC`` does (``checkpoint_wrapper(preserve_rng_state=False)``); the debug config's own default is
``SelectiveAC`` (op-level), not reproduced.

Shrunk for CI: batch 2 x 128 tokens (the debug config: 8 x 2048) and 2 layers; the width, heads, FFN and
vocabulary are the debug model's.
"""
import torch
import torch.nn as nn
import torch.nn.functional as F
from torch.utils.checkpoint import checkpoint

DIM, HEADS, LAYERS, VOCAB, FFN, THETA = 256, 16, 2, 2048, 768, 500000.0
BATCH, SEQ, CHUNKS = 2, 128, 8


class RoPE(nn.Module):
    def __init__(self, head_dim, length):
        super().__init__()
        inv = 1.0 / (THETA ** (torch.arange(0, head_dim, 2).float() / head_dim))
        angles = torch.outer(torch.arange(length).float(), inv)
        self.register_buffer("cache", torch.polar(torch.ones_like(angles), angles), persistent=False)

    def forward(self, q, k):
        t = q.shape[1]
        rot = self.cache[:t].view(1, t, 1, -1)

        def turn(x):
            pairs = torch.view_as_complex(x.float().reshape(*x.shape[:-1], -1, 2))
            return torch.view_as_real(pairs * rot).flatten(3).type_as(x)
        return turn(q), turn(k)


class Attention(nn.Module):
    def __init__(self):
        super().__init__()
        self.head_dim = DIM // HEADS
        self.wqkv = nn.Linear(DIM, 3 * DIM, bias=False)
        self.wo = nn.Linear(DIM, DIM, bias=False)
        self.rope = RoPE(self.head_dim, SEQ)

    def forward(self, x):
        b, t, _ = x.shape
        q, k, v = self.wqkv(x).view(b, t, 3, HEADS, self.head_dim).unbind(2)
        q, k = self.rope(q, k)
        y = F.scaled_dot_product_attention(q.transpose(1, 2), k.transpose(1, 2), v.transpose(1, 2), is_causal=True)
        return self.wo(y.transpose(1, 2).reshape(b, t, DIM))


class FeedForward(nn.Module):
    def __init__(self):
        super().__init__()
        self.w1, self.w3 = nn.Linear(DIM, FFN, bias=False), nn.Linear(DIM, FFN, bias=False)
        self.w2 = nn.Linear(FFN, DIM, bias=False)

    def forward(self, x):
        return self.w2(F.silu(self.w1(x)) * self.w3(x))


class Block(nn.Module):
    def __init__(self):
        super().__init__()
        self.attention_norm, self.ffn_norm = nn.RMSNorm(DIM, eps=1e-5), nn.RMSNorm(DIM, eps=1e-5)
        self.attention, self.feed_forward = Attention(), FeedForward()

    def forward(self, x):
        h = x + self.attention(self.attention_norm(x))
        return h + self.feed_forward(self.ffn_norm(h))


class Checkpointed(nn.Module):
    """A block under full activation checkpointing (what ``checkpoint_wrapper`` does to it)."""

    def __init__(self, block):
        super().__init__()
        self._checkpoint_wrapped_module = block

    def forward(self, x):
        return checkpoint(self._checkpoint_wrapped_module, x, use_reentrant=False, preserve_rng_state=False)


class Llama3(nn.Module):
    def __init__(self):
        super().__init__()
        self.tok_embeddings = nn.Embedding(VOCAB, DIM)
        self.layers = nn.ModuleDict({str(i): Block() for i in range(LAYERS)})
        self.norm = nn.RMSNorm(DIM, eps=1e-5)
        self.lm_head = nn.Linear(DIM, VOCAB, bias=False)

    def forward(self, tokens):  # the lm_head runs in the chunked loss
        h = self.tok_embeddings(tokens)
        for layer in self.layers.values():
            h = layer(h)
        return self.norm(h)


def model():
    return Llama3()


def chunked_loss(net, hidden, labels):
    """lm_head + cross-entropy per sequence chunk, each chunk's backward at once; then the decoder's."""
    cut = hidden.detach().requires_grad_(True)
    total = torch.zeros((), device=hidden.device)
    n = labels.numel()
    for h, y in zip(cut.chunk(CHUNKS, dim=1), labels.chunk(CHUNKS, dim=1), strict=True):
        logits = net.lm_head(h).float()
        loss = F.cross_entropy(logits.flatten(0, 1), y.flatten(), reduction="sum") / n
        loss.backward()
        total += loss.detach()
    hidden.backward(cut.grad)
    return total


def _make(full_ac):
    device = torch.device("cuda")
    net = model()
    if full_ac:
        for name, block in list(net.layers.items()):
            net.layers[name] = Checkpointed(block)
    net.to(device)
    net.train()
    optimizer = torch.optim.AdamW(net.parameters(), lr=8e-4, betas=(0.9, 0.95), eps=1e-8, weight_decay=0.1,
                                  fused=True)
    tokens = torch.randint(VOCAB, (BATCH, SEQ + 1))

    def step():
        optimizer.zero_grad(set_to_none=False)
        inputs, labels = tokens[:, :-1].to(device), tokens[:, 1:].to(device)
        with torch.autocast("cuda", dtype=torch.bfloat16):
            hidden = net(inputs)
            loss = chunked_loss(net, hidden, labels)
        del hidden
        torch.nn.utils.clip_grad_norm_(net.parameters(), 1.0, foreach=True)
        optimizer.step()
        return loss
    return step


def torchtitan_llama3():
    return _make(full_ac=False)


def torchtitan_llama3_full_ac():
    return _make(full_ac=True)
