"""CLIP contrastive training as OpenCLIP's ``train_one_epoch`` runs it (mlfoundations/open_clip at
b84cf9b669a6, ``src/open_clip_train/train.py: train_one_epoch`` with ``--precision amp --accum-freq 1``,
``src/open_clip/loss.py: ClipLoss``; MIT licence).

Reproduced in this file's own words: images and texts moved with ``non_blocking=True``,
``optimizer.zero_grad()``, the two towers' forward under fp16 autocast, the symmetric contrastive loss
(``logit_scale · image_features @ text_features.T`` and its transpose against ``arange`` labels, the two
cross-entropies averaged), the ``GradScaler``'s ``scale(loss).backward()`` / ``step`` / ``update``, then the
learned temperature clamped in place (``logit_scale.clamp_(0, ln 100)``) under ``no_grad``. OpenCLIP's
model package needs torchvision, which cannot be installed beside the CPU torch wheel here, so the two
towers are the transformers package's ``CLIPModel`` (a ViT image tower and a causal text tower with
projections, and the scalar ``logit_scale`` parameter), whose normalised ``image_embeds`` / ``text_embeds``
are what OpenCLIP's ``encode_image`` / ``encode_text(normalize=True)`` return. AdamW with OpenCLIP's two
groups (gains, biases and ``logit_scale`` not decayed; weight decay 0.2, betas 0.9 / 0.98, eps 1e-6).

Shrunk for CI: both towers width 64, 2 layers, 2 heads, 32x32 images in 8x8 patches, 16 text tokens,
vocab 512, projection 32, batch 4 (ViT-B/32: 768 / 512 wide, 12 layers, 224x224, 77 tokens).
"""
import math

import torch
import torch.nn.functional as F
from transformers import CLIPConfig, CLIPModel

BATCH, SIDE, TOKENS = 4, 32, 16
TEXT = dict(vocab_size=512, hidden_size=64, intermediate_size=128, num_hidden_layers=2, num_attention_heads=2,
            max_position_embeddings=TOKENS)
VISION = dict(hidden_size=64, intermediate_size=128, num_hidden_layers=2, num_attention_heads=2, image_size=SIDE,
              patch_size=8)


def model():
    return CLIPModel(CLIPConfig(text_config=TEXT, vision_config=VISION, projection_dim=32))


def clip_loss(image_features, text_features, logit_scale):
    logits_per_image = logit_scale * image_features @ text_features.T
    labels = torch.arange(logits_per_image.shape[0], device=image_features.device, dtype=torch.long)
    return (F.cross_entropy(logits_per_image, labels) + F.cross_entropy(logits_per_image.T, labels)) / 2


def open_clip():
    device = torch.device("cuda")
    net = model().to(device)
    excluded = [p for n, p in net.named_parameters() if p.ndim < 2 or "bn" in n or "ln" in n or "bias" in n
                or "logit_scale" in n]
    rest = [p for p in net.parameters() if all(p is not e for e in excluded)]
    optimizer = torch.optim.AdamW([{"params": excluded, "weight_decay": 0.0}, {"params": rest, "weight_decay": 0.2}],
                                  lr=5e-4, betas=(0.9, 0.98), eps=1e-6)
    scaler = torch.amp.GradScaler("cuda")
    images_cpu, texts_cpu = torch.randn(BATCH, 3, SIDE, SIDE), torch.randint(512, (BATCH, TOKENS))
    net.train()

    def step():
        images = images_cpu.to(device=device, non_blocking=True)
        texts = texts_cpu.to(device=device, non_blocking=True)
        optimizer.zero_grad()
        with torch.autocast("cuda", dtype=torch.float16):
            out = net(input_ids=texts, pixel_values=images)
            total_loss = clip_loss(out.image_embeds, out.text_embeds, net.logit_scale.exp())
        scaler.scale(total_loss).backward()
        scaler.step(optimizer)
        scaler.update()
        with torch.no_grad():
            net.logit_scale.clamp_(0, math.log(100))
        return total_loss
    return step
