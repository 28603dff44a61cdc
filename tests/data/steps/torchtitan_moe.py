"""A mixture-of-experts decoder trained as torchtitan trains its MoE models on one GPU (pytorch/torchtitan at
b5bcd76c66d0, BSD-3-Clause licence; ``torchtitan/models/common/moe.py: MoE`` / ``TokenChoiceTopKRouter`` /
``GroupedExperts``, ``torchtitan/components/optimizer/optimizer.py`` (the expert-bias pre-hook),
``trainer.py: Trainer.train_step``).

Reproduced in this file's own words: each block's feed-forward is an ``MoE``: a bias-free ``gate`` Linear
router run under a nested fp32 autocast (sigmoid scores in fp32, top-k picked on scores plus the ``expert_bias_E`` buffer of auxiliary-loss-
free load balancing, the picked scores normalised), a bool routing map whose column sums count tokens per
expert (accumulated into the ``tokens_per_expert_E`` buffer without grad), a local token dispatcher that
sorts the ``T·K`` (token, expert) rows by expert and gathers them, ``GroupedExperts`` holding three 3-D
parameters ``w1_EFD`` / ``w3_EFD`` / ``w2_EDF`` and running SwiGLU through ``torch._grouped_mm`` on bf16 casts
with ``cumsum`` offsets, the rows weighted by their scores and ``scatter_add``-ed back, plus one shared
expert. Attention, norms and embeddings as torchtitan's Llama 3 (see ``torchtitan_llama3.py``). The step:
``zero_grad(set_to_none=False)``, bf16 autocast, loss, backward, ``clip_grad_norm_(1.0)``, fused AdamW, whose
step *pre-hook* (registered by torchtitan's optimizer container for MoE models) moves each ``expert_bias_E``
by ``coeff · sign(mean − tokens_per_expert)`` and zeroes the counters.

Shrunk for CI (a debug size of this file's choosing, not a torchtitan config): dim 128, 2 layers, 4 heads,
8 experts top-2 with hidden 128, one shared expert, vocab 512, batch 2 x 64.
"""
import torch
import torch.nn as nn
import torch.nn.functional as F

DIM, HEADS, LAYERS, VOCAB, EXPERTS, TOP_K, HIDDEN, BATCH, SEQ = 128, 4, 2, 512, 8, 2, 128, 2, 64
COEFF = 1e-3


class Attention(nn.Module):
    def __init__(self):
        super().__init__()
        self.wqkv, self.wo = nn.Linear(DIM, 3 * DIM, bias=False), nn.Linear(DIM, DIM, bias=False)

    def forward(self, x):
        b, t, _ = x.shape
        q, k, v = self.wqkv(x).view(b, t, 3, HEADS, DIM // HEADS).permute(2, 0, 3, 1, 4).unbind(0)
        return self.wo(F.scaled_dot_product_attention(q, k, v, is_causal=True).transpose(1, 2).reshape(b, t, DIM))


class GroupedExperts(nn.Module):
    def __init__(self):
        super().__init__()
        self.w1_EFD = nn.Parameter(torch.randn(EXPERTS, HIDDEN, DIM) * 0.02)
        self.w3_EFD = nn.Parameter(torch.randn(EXPERTS, HIDDEN, DIM) * 0.02)
        self.w2_EDF = nn.Parameter(torch.randn(EXPERTS, DIM, HIDDEN) * 0.02)

    def forward(self, rows, counts):
        offs = torch.cumsum(counts, dim=0, dtype=torch.int32)
        x = rows.bfloat16()
        h = F.silu(torch._grouped_mm(x, self.w1_EFD.bfloat16().transpose(-2, -1), offs=offs))
        h = h * torch._grouped_mm(x, self.w3_EFD.bfloat16().transpose(-2, -1), offs=offs)
        return torch._grouped_mm(h, self.w2_EDF.bfloat16().transpose(-2, -1), offs=offs).type_as(rows)


class SwiGLU(nn.Module):
    def __init__(self, hidden):
        super().__init__()
        self.w1, self.w3 = nn.Linear(DIM, hidden, bias=False), nn.Linear(DIM, hidden, bias=False)
        self.w2 = nn.Linear(hidden, DIM, bias=False)

    def forward(self, x):
        return self.w2(F.silu(self.w1(x)) * self.w3(x))


class MoE(nn.Module):
    def __init__(self):
        super().__init__()
        self.gate = nn.Linear(DIM, EXPERTS, bias=False)
        self.experts = GroupedExperts()
        self.shared_experts = SwiGLU(HIDDEN)
        self.register_buffer("expert_bias_E", torch.zeros(EXPERTS, dtype=torch.float32))
        self.register_buffer("tokens_per_expert_E", torch.zeros(EXPERTS, dtype=torch.float32), persistent=False)

    def forward(self, x):
        shape = x.shape
        x = x.reshape(-1, DIM)
        with torch.autocast(device_type=x.device.type, dtype=torch.float32):  # the gate GEMM in fp32
            scores = torch.sigmoid(self.gate(x))
        _, ids = torch.topk(scores + self.expert_bias_E, TOP_K, dim=-1)
        picked = scores.gather(-1, ids)
        picked = picked / (picked.sum(-1, keepdim=True) + 1e-20)
        routing = torch.zeros_like(scores, dtype=torch.bool).scatter_(-1, ids, True)
        counts = routing.sum(dim=0)
        with torch.no_grad():
            self.tokens_per_expert_E.add_(counts)
        order = torch.argsort(ids.view(-1), stable=True)
        token = order // TOP_K
        out = self.experts(x[token], counts) * picked.view(-1)[order].unsqueeze(-1).to(x.dtype)
        routed = torch.zeros_like(x).scatter_add(0, token.unsqueeze(-1).expand(-1, DIM), out)
        return (routed + self.shared_experts(x)).reshape(shape)


class Block(nn.Module):
    def __init__(self):
        super().__init__()
        self.attention_norm, self.ffn_norm = nn.RMSNorm(DIM), nn.RMSNorm(DIM)
        self.attention, self.moe = Attention(), MoE()

    def forward(self, x):
        h = x + self.attention(self.attention_norm(x))
        return h + self.moe(self.ffn_norm(h))


class Decoder(nn.Module):
    def __init__(self):
        super().__init__()
        self.tok_embeddings = nn.Embedding(VOCAB, DIM)
        self.layers = nn.ModuleDict({str(i): Block() for i in range(LAYERS)})
        self.norm, self.output = nn.RMSNorm(DIM), nn.Linear(DIM, VOCAB, bias=False)

    def forward(self, tokens):
        h = self.tok_embeddings(tokens)
        for layer in self.layers.values():
            h = layer(h)
        return self.output(self.norm(h))


def model():
    return Decoder()


def torchtitan_moe():
    device = torch.device("cuda")
    net = model().to(device)
    optimizer = torch.optim.AdamW(net.parameters(), lr=8e-4, betas=(0.9, 0.95), weight_decay=0.1, fused=True)
    moes = [m for m in net.modules() if isinstance(m, MoE)]

    @torch.no_grad()
    def update_expert_bias(opt, args, kwargs):
        for m in moes:
            counts = m.tokens_per_expert_E
            m.expert_bias_E.add_(COEFF * torch.sign(counts.mean() - counts))
            counts.zero_()

    optimizer.register_step_pre_hook(update_expert_bias)
    tokens = torch.randint(VOCAB, (BATCH, SEQ + 1))
    net.train()

    def step():
        optimizer.zero_grad(set_to_none=False)
        inputs, labels = tokens[:, :-1].to(device), tokens[:, 1:].to(device)
        with torch.autocast("cuda", dtype=torch.bfloat16):
            logits = net(inputs)
        loss = F.cross_entropy(logits.float().flatten(0, 1), labels.flatten())
        loss.backward()
        torch.nn.utils.clip_grad_norm_(net.parameters(), 1.0, foreach=True)
        optimizer.step()
        return loss
    return step
