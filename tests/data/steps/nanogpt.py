"""nanoGPT's training step (karpathy/nanoGPT, train.py and model.py at 3adf61e154c3, MIT licence).

What is reproduced, in this file's own words: the GPT of ``model.py`` (learned token and position
embeddings, pre-LayerNorm blocks with a fused ``c_attn`` q/k/v Linear and ``scaled_dot_product_attention``
with ``is_causal=True``, a 4x GELU MLP, ``bias=False`` LayerNorms and Linears, the token embedding *tied*
to ``lm_head``), ``GPT.configure_optimizers`` (two AdamW groups: >=2-D tensors decayed, the rest not;
``fused=True`` because the device is CUDA) and ``train.py``'s inner loop: ``gradient_accumulation_steps``
micro-batches each under ``torch.amp.autocast`` with the loss divided by the step count and
``scaler.scale(loss).backward()``, the next batch fetched right after the forward, then
``scaler.unscale_``, ``clip_grad_norm_(1.0)``, ``scaler.step``, ``scaler.update`` and
``zero_grad(set_to_none=True)``; ``torch.compile(model)`` when ``compile`` is on (the script's default).

Shrunk for CI: n_layer 2, n_head 2, n_embd 64, block_size 64, vocab 512, batch 4, 2 accumulation
steps (the script: 12 / 12 / 768 / 1024 / 50304 / 12 / 40). ``nanogpt_fp16`` is the script run with
``--dtype=float16``, where the GradScaler is enabled; ``nanogpt`` keeps its bfloat16 default (the
scaler is a no-op).

A public measurement: karpathy/nanoGPT issue #88 (comment by aartivnkt, 2023-03-08) runs
``python train.py --batch_size=32 --compile=False`` on one 16 GB GPU ("15.78 GiB total capacity", a V100,
which has no bf16, so the script picks float16 and the GradScaler) and reports ``CUDA out of memory.
Tried to allocate 6.14 GiB (GPU 0; 15.78 GiB total capacity; 10.16 GiB already allocated``. 6.14 GiB is
32 x 1024 x 50304 fp32 logits, the loss's upcast. ``nanogpt_issue88`` is that configuration at full size
(GPT-2 124M, block 1024, vocab 50304, batch 32, the default 40 accumulation steps, float16, no compile);
``tools/step_corpus_compare.py`` simulates it on a 15.78 GiB device and compares its first OOM with the
report. The first iteration's ``estimate_loss`` runs before any training (``iter_num % eval_interval == 0``):
its ``logits, loss`` stay bound from one evaluation batch to the next, so the second batch's forward runs
beside the first batch's fp16 logits (3.07 GiB), and ``F.cross_entropy`` under autocast makes fp16
log-probabilities (``cross_entropy_loss`` passes the input's dtype to ``log_softmax``, which
``fp32_set_opt_dtype`` then leaves alone) that ``nll_loss``'s fp32 policy copies to fp32: the 6.14 GiB
request. A V100 runs SDPA's memory-efficient kernel where the capture records flash (same saved shapes
but the logsumexp padding).
"""
import math

import torch
import torch.nn as nn
import torch.nn.functional as F

CONFIG = dict(n_layer=2, n_head=2, n_embd=64, block_size=64, vocab_size=512)
BATCH, ACCUM = 4, 2


class Norm(nn.Module):
    """LayerNorm whose bias can be switched off (nanoGPT's own LayerNorm)."""

    def __init__(self, width, bias):
        super().__init__()
        self.weight = nn.Parameter(torch.ones(width))
        self.bias = nn.Parameter(torch.zeros(width)) if bias else None

    def forward(self, x):
        return F.layer_norm(x, (x.shape[-1],), self.weight, self.bias, 1e-5)


class Attention(nn.Module):
    def __init__(self, c):
        super().__init__()
        self.heads, self.width = c["n_head"], c["n_embd"]
        self.c_attn = nn.Linear(self.width, 3 * self.width, bias=False)
        self.c_proj = nn.Linear(self.width, self.width, bias=False)
        self.resid_dropout = nn.Dropout(0.0)

    def forward(self, x):
        b, t, w = x.shape
        q, k, v = (z.reshape(b, t, self.heads, w // self.heads).transpose(1, 2)
                   for z in self.c_attn(x).split(w, dim=2))
        y = F.scaled_dot_product_attention(q, k, v, dropout_p=0.0, is_causal=True)
        return self.resid_dropout(self.c_proj(y.transpose(1, 2).reshape(b, t, w)))


class Block(nn.Module):
    def __init__(self, c):
        super().__init__()
        w = c["n_embd"]
        self.ln_1, self.attn, self.ln_2 = Norm(w, False), Attention(c), Norm(w, False)
        self.mlp = nn.Sequential(nn.Linear(w, 4 * w, bias=False), nn.GELU(), nn.Linear(4 * w, w, bias=False),
                                 nn.Dropout(0.0))

    def forward(self, x):
        x = x + self.attn(self.ln_1(x))
        return x + self.mlp(self.ln_2(x))


class GPT(nn.Module):
    def __init__(self, c):
        super().__init__()
        self.transformer = nn.ModuleDict(dict(
            wte=nn.Embedding(c["vocab_size"], c["n_embd"]), wpe=nn.Embedding(c["block_size"], c["n_embd"]),
            drop=nn.Dropout(0.0), h=nn.ModuleList(Block(c) for _ in range(c["n_layer"])),
            ln_f=Norm(c["n_embd"], False)))
        self.lm_head = nn.Linear(c["n_embd"], c["vocab_size"], bias=False)
        self.transformer.wte.weight = self.lm_head.weight  # weight tying: one tensor, two modules
        for name, p in self.named_parameters():
            std = 0.02 / math.sqrt(2 * c["n_layer"]) if name.endswith("2.weight") else 0.02
            if p.dim() >= 2:
                nn.init.normal_(p, 0.0, std)

    def forward(self, idx, targets):
        pos = torch.arange(idx.shape[1], dtype=torch.long, device=idx.device)
        x = self.transformer.drop(self.transformer.wte(idx) + self.transformer.wpe(pos))
        for block in self.transformer.h:
            x = block(x)
        logits = self.lm_head(self.transformer.ln_f(x))
        return logits, F.cross_entropy(logits.view(-1, logits.size(-1)), targets.view(-1), ignore_index=-1)


def model():
    return GPT(CONFIG)


def optimizer_of(net, device_type="cuda"):
    decay = [p for p in net.parameters() if p.requires_grad and p.dim() >= 2]
    rest = [p for p in net.parameters() if p.requires_grad and p.dim() < 2]
    groups = [{"params": decay, "weight_decay": 0.1}, {"params": rest, "weight_decay": 0.0}]
    return torch.optim.AdamW(groups, lr=6e-4, betas=(0.9, 0.95), fused=device_type == "cuda")


def _make(dtype, compile=True, config=CONFIG, batch_size=BATCH, accum=ACCUM, eval_iters=0):
    device = "cuda"
    torch.backends.cuda.matmul.allow_tf32 = True
    torch.backends.cudnn.allow_tf32 = True
    net = GPT(config)
    net.to(device)
    scaler = torch.cuda.amp.GradScaler(enabled=dtype == torch.float16)
    optimizer = optimizer_of(net)
    if compile:
        net = torch.compile(net)
    ctx = torch.amp.autocast(device_type="cuda", dtype=dtype)

    def batch():
        x = torch.randint(config["vocab_size"], (batch_size, config["block_size"]))
        y = torch.randint(config["vocab_size"], (batch_size, config["block_size"]))
        return x.pin_memory().to(device, non_blocking=True), y.pin_memory().to(device, non_blocking=True)

    data = {"xy": batch(), "iter_num": 0}

    @torch.no_grad()
    def estimate_loss():  # the script's evaluation: `logits, loss` stay bound until the next forward returns
        net.eval()
        for _split in ("train", "val"):
            losses = torch.zeros(eval_iters)
            for k in range(eval_iters):
                X, Y = batch()
                with ctx:
                    logits, loss = net(X, Y)
                losses[k] = loss.item()
        net.train()

    def step():
        if eval_iters and data["iter_num"] == 0:  # iter_num % eval_interval == 0: evaluate first
            estimate_loss()
        data["iter_num"] += 1
        for _ in range(accum):
            with ctx:
                _, loss = net(*data["xy"])
                loss = loss / accum
            data["xy"] = batch()  # the next batch arrives while the GPU runs this one
            scaler.scale(loss).backward()
        scaler.unscale_(optimizer)
        torch.nn.utils.clip_grad_norm_(net.parameters(), 1.0)
        scaler.step(optimizer)
        scaler.update()
        optimizer.zero_grad(set_to_none=True)
    return step


def nanogpt():
    return _make(torch.bfloat16)


def nanogpt_fp16():
    return _make(torch.float16)


def nanogpt_issue88():
    """nanoGPT issue #88's run: ``train.py --batch_size=32 --compile=False`` on a V100 (float16); its first
    iteration evaluates first (2 of the script's 200 ``eval_iters`` per split: the memory pattern repeats
    from the second)."""
    gpt2 = dict(n_layer=12, n_head=12, n_embd=768, block_size=1024, vocab_size=50304)
    return _make(torch.float16, compile=False, config=gpt2, batch_size=32, accum=40, eval_iters=2)
