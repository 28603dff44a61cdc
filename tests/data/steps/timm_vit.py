"""A ViT trained as timm's ``train.py`` trains it: fp16 autocast with its loss scaler, and a model EMA
(huggingface/pytorch-image-models at 2aabaef039d9, ``train.py: train_one_epoch`` with ``--amp
--amp-dtype float16 --model-ema --opt adamw --weight-decay 0.05 --clip-grad 1.0 --smoothing 0.1``;
``timm/utils/cuda.py: NativeScaler``; ``timm/utils/model_ema.py: ModelEmaV3``;
``timm/optim/_param_groups.py: param_groups_weight_decay``; Apache-2.0 licence).

timm cannot be installed beside the CPU torch wheel here (it needs torchvision), so the ViT's module
tree is written out in this file's own words as ``timm/models/vision_transformer.py: VisionTransformer``
lays it out: ``patch_embed.proj`` (a stride-16 conv), a ``cls_token`` and a learned ``pos_embed``
parameter, ``blocks`` of ``norm1`` / ``attn`` (one ``qkv`` Linear with bias, fused SDPA, ``proj``) /
``norm2`` / ``mlp`` (``fc1``, GELU, ``fc2``), a final ``norm`` and the ``head``. The step, in this file's
own words: batch to the device, forward and label-smoothing cross-entropy under
``torch.autocast("cuda", dtype=torch.float16)``, the scaler's ``scale(loss).backward()``, ``unscale_``,
gradient clipping by norm, ``scaler.step(optimizer)``, ``scaler.update()``, ``optimizer.zero_grad()``, then
``model_ema.update(model)`` — a deep copy of the model (frozen, eval mode) whose parameters and buffers
are lerped toward the model's with ``torch._foreach_lerp_``. AdamW's groups: 1-D parameters and the
``cls_token`` / ``pos_embed`` are not decayed (timm's ``no_weight_decay``). timm's
``LabelSmoothingCrossEntropy`` is written as ``F.cross_entropy(label_smoothing=0.1)``.

Shrunk for CI: ViT-Ti/16's layout at width 96, 2 blocks, 3 heads, on 64x64 images, batch 4, 100 classes
(vit_tiny_patch16_224: 192 wide, 12 blocks, 224x224, 1000 classes).
"""
import copy

import torch
import torch.nn as nn
import torch.nn.functional as F

WIDTH, DEPTH, HEADS, PATCH, SIDE, CLASSES, BATCH = 96, 2, 3, 16, 64, 100, 4


class Attention(nn.Module):
    def __init__(self):
        super().__init__()
        self.qkv, self.proj = nn.Linear(WIDTH, 3 * WIDTH), nn.Linear(WIDTH, WIDTH)

    def forward(self, x):
        b, n, w = x.shape
        q, k, v = self.qkv(x).reshape(b, n, 3, HEADS, w // HEADS).permute(2, 0, 3, 1, 4).unbind(0)
        return self.proj(F.scaled_dot_product_attention(q, k, v).transpose(1, 2).reshape(b, n, w))


class Mlp(nn.Module):
    def __init__(self):
        super().__init__()
        self.fc1, self.act, self.fc2 = nn.Linear(WIDTH, 4 * WIDTH), nn.GELU(), nn.Linear(4 * WIDTH, WIDTH)

    def forward(self, x):
        return self.fc2(self.act(self.fc1(x)))


class Block(nn.Module):
    def __init__(self):
        super().__init__()
        self.norm1, self.attn = nn.LayerNorm(WIDTH, eps=1e-6), Attention()
        self.norm2, self.mlp = nn.LayerNorm(WIDTH, eps=1e-6), Mlp()

    def forward(self, x):
        x = x + self.attn(self.norm1(x))
        return x + self.mlp(self.norm2(x))


class PatchEmbed(nn.Module):
    def __init__(self):
        super().__init__()
        self.proj = nn.Conv2d(3, WIDTH, PATCH, PATCH)

    def forward(self, x):
        return self.proj(x).flatten(2).transpose(1, 2)


class VisionTransformer(nn.Module):
    def __init__(self):
        super().__init__()
        self.patch_embed = PatchEmbed()
        self.cls_token = nn.Parameter(torch.zeros(1, 1, WIDTH))
        self.pos_embed = nn.Parameter(torch.randn(1, (SIDE // PATCH) ** 2 + 1, WIDTH) * 0.02)
        self.blocks = nn.Sequential(*(Block() for _ in range(DEPTH)))
        self.norm, self.head = nn.LayerNorm(WIDTH, eps=1e-6), nn.Linear(WIDTH, CLASSES)

    def forward(self, x):
        x = self.patch_embed(x)
        x = torch.cat([self.cls_token.expand(x.shape[0], -1, -1), x], dim=1) + self.pos_embed
        return self.head(self.norm(self.blocks(x))[:, 0])


def model():
    return VisionTransformer()


class ModelEma(nn.Module):
    """An EMA copy of a model: its own parameters and buffers, updated by lerp after each step."""

    def __init__(self, net, decay):
        super().__init__()
        self.module = copy.deepcopy(net).eval().requires_grad_(False)
        self.decay = decay

    @torch.no_grad()
    def update(self, net):
        ema = list(self.module.parameters()) + list(self.module.buffers())
        live = list(net.parameters()) + list(net.buffers())
        torch._foreach_lerp_([e for e in ema if e.is_floating_point()],
                             [m for m in live if m.is_floating_point()], 1.0 - self.decay)


def timm_vit():
    device = torch.device("cuda")
    net = model().to(device)
    no_decay = [p for n, p in net.named_parameters() if p.ndim <= 1 or n in ("cls_token", "pos_embed")]
    decay = [p for p in net.parameters() if all(p is not q for q in no_decay)]
    optimizer = torch.optim.AdamW([{"params": no_decay, "weight_decay": 0.0},
                                   {"params": decay, "weight_decay": 0.05}], lr=5e-4)
    scaler = torch.amp.GradScaler("cuda")
    model_ema = ModelEma(net, decay=0.9998)
    images, target = torch.randn(BATCH, 3, SIDE, SIDE), torch.randint(CLASSES, (BATCH,))
    net.train()

    def step():
        x, y = images.to(device), target.to(device)
        with torch.autocast("cuda", dtype=torch.float16):
            loss = F.cross_entropy(net(x), y, label_smoothing=0.1)
        scaler.scale(loss).backward()
        scaler.unscale_(optimizer)
        torch.nn.utils.clip_grad_norm_(net.parameters(), 1.0)
        scaler.step(optimizer)
        scaler.update()
        optimizer.zero_grad()
        model_ema.update(net)
        return loss
    return step
