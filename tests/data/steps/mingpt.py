"""minGPT's training step (karpathy/minGPT, mingpt/trainer.py and mingpt/model.py at 37baab71b9ab, MIT
licence).

Reproduced in this file's own words: the ``gpt-mini`` GPT of ``model.py`` (6 layers, 6 heads, width 192;
untied ``lm_head``; LayerNorm and Linear biases; *explicit* attention: ``q @ k^T`` scaled, masked by a
registered ``block_size x block_size`` lower-triangular fp32 buffer ``bias`` per layer, softmax, dropout
0.1, ``@ v``; a hand-written tanh GELU) and ``Trainer.run``'s step: batch moved with ``.to(device)``,
forward with the loss, then ``model.zero_grad(set_to_none=True)`` *after* the forward, backward,
``clip_grad_norm_(1.0)``, ``optimizer.step()`` — AdamW over two groups (Linear weights decayed 0.1,
biases / LayerNorm / Embedding weights not), torch.optim's default implementation. fp32, no autocast.

Shrunk for CI: 2 layers, block_size 32, vocab 128, batch 4 (the trainer's default batch is 64).
"""
import math

import torch
import torch.nn as nn
import torch.nn.functional as F

N_LAYER, N_HEAD, N_EMBD, BLOCK, VOCAB, BATCH = 2, 6, 192, 32, 128, 4


class TanhGELU(nn.Module):
    def forward(self, x):
        return 0.5 * x * (1.0 + torch.tanh(math.sqrt(2.0 / math.pi) * (x + 0.044715 * torch.pow(x, 3.0))))


class MaskedAttention(nn.Module):
    def __init__(self):
        super().__init__()
        self.c_attn, self.c_proj = nn.Linear(N_EMBD, 3 * N_EMBD), nn.Linear(N_EMBD, N_EMBD)
        self.attn_dropout, self.resid_dropout = nn.Dropout(0.1), nn.Dropout(0.1)
        self.register_buffer("bias", torch.tril(torch.ones(BLOCK, BLOCK)).view(1, 1, BLOCK, BLOCK))

    def forward(self, x):
        b, t, w = x.shape
        q, k, v = (z.reshape(b, t, N_HEAD, w // N_HEAD).transpose(1, 2) for z in self.c_attn(x).split(w, dim=2))
        scores = (q @ k.transpose(-2, -1)) / math.sqrt(k.shape[-1])
        scores = scores.masked_fill(self.bias[:, :, :t, :t] == 0, float("-inf"))
        y = self.attn_dropout(F.softmax(scores, dim=-1)) @ v
        return self.resid_dropout(self.c_proj(y.transpose(1, 2).contiguous().reshape(b, t, w)))


class Block(nn.Module):
    def __init__(self):
        super().__init__()
        self.ln_1, self.attn, self.ln_2 = nn.LayerNorm(N_EMBD), MaskedAttention(), nn.LayerNorm(N_EMBD)
        self.mlp = nn.ModuleDict(dict(c_fc=nn.Linear(N_EMBD, 4 * N_EMBD), c_proj=nn.Linear(4 * N_EMBD, N_EMBD),
                                      act=TanhGELU(), dropout=nn.Dropout(0.1)))

    def forward(self, x):
        x = x + self.attn(self.ln_1(x))
        m = self.mlp
        return x + m.dropout(m.c_proj(m.act(m.c_fc(self.ln_2(x)))))


class GPT(nn.Module):
    def __init__(self):
        super().__init__()
        self.transformer = nn.ModuleDict(dict(
            wte=nn.Embedding(VOCAB, N_EMBD), wpe=nn.Embedding(BLOCK, N_EMBD), drop=nn.Dropout(0.1),
            h=nn.ModuleList(Block() for _ in range(N_LAYER)), ln_f=nn.LayerNorm(N_EMBD)))
        self.lm_head = nn.Linear(N_EMBD, VOCAB, bias=False)

    def forward(self, idx, targets):
        pos = torch.arange(0, idx.shape[1], dtype=torch.long, device=idx.device).unsqueeze(0)
        x = self.transformer.drop(self.transformer.wte(idx) + self.transformer.wpe(pos))
        for block in self.transformer.h:
            x = block(x)
        logits = self.lm_head(self.transformer.ln_f(x))
        return logits, F.cross_entropy(logits.view(-1, logits.size(-1)), targets.view(-1), ignore_index=-1)


def model():
    return GPT()


def optimizer_of(net):
    decay = [p for n, p in net.named_parameters() if n.endswith("weight") and p.dim() == 2 and "wte" not in n
             and "wpe" not in n]
    rest = [p for p in net.parameters() if all(p is not d for d in decay)]
    return torch.optim.AdamW([{"params": decay, "weight_decay": 0.1}, {"params": rest, "weight_decay": 0.0}],
                             lr=3e-4, betas=(0.9, 0.95))


def mingpt():
    device = "cuda" if torch.cuda.is_available() else "cpu"
    net = model().to(device)
    optimizer = optimizer_of(net)
    net.train()
    x, y = torch.randint(VOCAB, (BATCH, BLOCK)), torch.randint(VOCAB, (BATCH, BLOCK))

    def step():
        xb, yb = x.to(device), y.to(device)
        _, loss = net(xb, yb)
        net.zero_grad(set_to_none=True)
        loss.backward()
        torch.nn.utils.clip_grad_norm_(net.parameters(), 1.0)
        optimizer.step()
    return step
