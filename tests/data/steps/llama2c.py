"""llama2.c's training step (karpathy/llama2.c at 4cc06965654f, ``train.py`` and ``model.py``, MIT licence).

Reproduced in this file's own words: ``model.py``'s Llama-2 ``Transformer`` (``tok_embeddings`` *tied* to
``output``; per layer ``attention_norm`` / ``ffn_norm`` RMSNorms, ``attention`` with separate ``wq`` / ``wk``
/ ``wv`` / ``wo`` and K/V heads repeated to the query heads, rotary embeddings from the model's
non-persistent ``freqs_cos`` / ``freqs_sin`` buffers, ``scaled_dot_product_attention(is_causal=True)``,
SwiGLU ``feed_forward`` with hidden ``multiple_of``-rounded 2/3·4·dim, dropout; the loss computed inside
the forward and kept on ``model.last_loss``) and ``train.py``'s loop: ``gradient_accumulation_steps``
micro-batches under ``torch.amp.autocast(dtype=bfloat16)``, ``loss / steps``, the next batch fetched right
after each forward, ``scaler.scale(loss).backward()`` (the scaler disabled under bf16), ``unscale_``,
``clip_grad_norm_(1.0)``, ``scaler.step``, ``scaler.update``, ``zero_grad(set_to_none=True)``;
``configure_optimizers``' two AdamW groups with ``fused=True`` on CUDA; ``torch.compile(model)``.

The script's default model (dim 288, 6 layers, 6 heads, ``multiple_of`` 32, max_seq_len 256, dropout 0.0)
with n_kv_heads 2 (the script's flag; its default equals n_heads); shrunk for CI: 2 layers, vocab 512
(``--vocab_source=custom``; Llama 2's is 32000), batch 2 x 64, 2 accumulation steps (the script: 128 x 256,
4 steps).
"""
import math

import torch
import torch.nn as nn
import torch.nn.functional as F

DIM, LAYERS, HEADS, KV_HEADS, VOCAB, MULTIPLE, SEQ, BATCH, ACCUM = 288, 2, 6, 2, 512, 32, 64, 2, 2
HEAD = DIM // HEADS


class RMSNorm(nn.Module):
    def __init__(self, eps=1e-5):
        super().__init__()
        self.eps, self.weight = eps, nn.Parameter(torch.ones(DIM))

    def forward(self, x):
        x32 = x.float()
        return (x32 * torch.rsqrt(x32.pow(2).mean(-1, keepdim=True) + self.eps)).type_as(x) * self.weight


def rotate(x, cos, sin):
    pairs = x.float().reshape(*x.shape[:-1], -1, 2)
    re, im = pairs.unbind(-1)
    cos, sin = cos.view(1, x.shape[1], 1, -1), sin.view(1, x.shape[1], 1, -1)
    return torch.stack([re * cos - im * sin, re * sin + im * cos], dim=-1).flatten(3).type_as(x)


class Attention(nn.Module):
    def __init__(self):
        super().__init__()
        self.wq = nn.Linear(DIM, HEADS * HEAD, bias=False)
        self.wk = nn.Linear(DIM, KV_HEADS * HEAD, bias=False)
        self.wv = nn.Linear(DIM, KV_HEADS * HEAD, bias=False)
        self.wo = nn.Linear(HEADS * HEAD, DIM, bias=False)
        self.resid_dropout = nn.Dropout(0.0)

    def forward(self, x, cos, sin):
        b, t, _ = x.shape
        q = rotate(self.wq(x).view(b, t, HEADS, HEAD), cos, sin)
        k = rotate(self.wk(x).view(b, t, KV_HEADS, HEAD), cos, sin)
        v = self.wv(x).view(b, t, KV_HEADS, HEAD)
        rep = HEADS // KV_HEADS
        k, v = (z[:, :, :, None, :].expand(b, t, KV_HEADS, rep, HEAD).reshape(b, t, HEADS, HEAD) for z in (k, v))
        y = F.scaled_dot_product_attention(q.transpose(1, 2), k.transpose(1, 2), v.transpose(1, 2), is_causal=True)
        return self.resid_dropout(self.wo(y.transpose(1, 2).contiguous().view(b, t, -1)))


class FeedForward(nn.Module):
    def __init__(self):
        super().__init__()
        hidden = int(2 * 4 * DIM / 3)
        hidden = MULTIPLE * ((hidden + MULTIPLE - 1) // MULTIPLE)
        self.w1, self.w3 = nn.Linear(DIM, hidden, bias=False), nn.Linear(DIM, hidden, bias=False)
        self.w2, self.dropout = nn.Linear(hidden, DIM, bias=False), nn.Dropout(0.0)

    def forward(self, x):
        return self.dropout(self.w2(F.silu(self.w1(x)) * self.w3(x)))


class Layer(nn.Module):
    def __init__(self):
        super().__init__()
        self.attention, self.feed_forward = Attention(), FeedForward()
        self.attention_norm, self.ffn_norm = RMSNorm(), RMSNorm()

    def forward(self, x, cos, sin):
        h = x + self.attention(self.attention_norm(x), cos, sin)
        return h + self.feed_forward(self.ffn_norm(h))


class Transformer(nn.Module):
    def __init__(self):
        super().__init__()
        self.tok_embeddings, self.dropout = nn.Embedding(VOCAB, DIM), nn.Dropout(0.0)
        self.layers = nn.ModuleList(Layer() for _ in range(LAYERS))
        self.norm, self.output = RMSNorm(), nn.Linear(DIM, VOCAB, bias=False)
        self.tok_embeddings.weight = self.output.weight
        inv = 1.0 / (10000.0 ** (torch.arange(0, HEAD, 2)[: HEAD // 2].float() / HEAD))
        angles = torch.outer(torch.arange(SEQ), inv)
        self.register_buffer("freqs_cos", torch.cos(angles), persistent=False)
        self.register_buffer("freqs_sin", torch.sin(angles), persistent=False)
        for name, p in self.named_parameters():
            if name.endswith(("w3.weight", "wo.weight")):
                nn.init.normal_(p, 0.0, 0.02 / math.sqrt(2 * LAYERS))
        self.last_loss = None

    def forward(self, tokens, targets):
        t = tokens.shape[1]
        h = self.dropout(self.tok_embeddings(tokens))
        for layer in self.layers:
            h = layer(h, self.freqs_cos[:t], self.freqs_sin[:t])
        logits = self.output(self.norm(h))
        self.last_loss = F.cross_entropy(logits.view(-1, logits.size(-1)), targets.view(-1), ignore_index=-1)
        return logits


def model():
    return Transformer()


def llama2c():
    device = "cuda"
    raw = model()
    raw.to(device)
    scaler = torch.cuda.amp.GradScaler(enabled=False)
    params = [p for p in raw.parameters() if p.requires_grad]
    optimizer = torch.optim.AdamW([{"params": [p for p in params if p.dim() >= 2], "weight_decay": 0.1},
                                   {"params": [p for p in params if p.dim() < 2], "weight_decay": 0.0}],
                                  lr=5e-4, betas=(0.9, 0.95), fused=True)
    net = torch.compile(raw)
    ctx = torch.amp.autocast(device_type="cuda", dtype=torch.bfloat16)

    def batch():
        x = torch.randint(VOCAB, (BATCH, SEQ + 1))
        return x[:, :-1].to(device, non_blocking=True), x[:, 1:].to(device, non_blocking=True)

    data = {"xy": batch()}

    def step():
        for _ in range(ACCUM):
            with ctx:
                net(*data["xy"])
                loss = raw.last_loss / ACCUM
            data["xy"] = batch()
            scaler.scale(loss).backward()
        scaler.unscale_(optimizer)
        torch.nn.utils.clip_grad_norm_(net.parameters(), 1.0)
        scaler.step(optimizer)
        scaler.update()
        optimizer.zero_grad(set_to_none=True)
    return step
