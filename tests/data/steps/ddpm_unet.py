"""DDPM training of a UNet as diffusers' unconditional example runs it, with an EMA copy of the weights
(huggingface/diffusers at c2076599848a, ``examples/unconditional_image_generation/train_unconditional.py``,
Apache-2.0 licence).

Reproduced in this file's own words: ``UNet2DModel`` with down blocks ``DownBlock2D`` … ``AttnDownBlock2D`` and
the mirrored up blocks, ``DDPMScheduler(num_train_timesteps=1000)``, ``AdamW(lr=1e-4, betas=(0.95, 0.999),
weight_decay=1e-6, eps=1e-8)``, ``EMAModel`` (``--use_ema`` is on by default: a second full set of the
weights, updated after every optimizer step), and the loop body: noise drawn with ``torch.randn(shape)`` on
the host and moved to the images' device, timesteps drawn with ``torch.randint(…, device=…)``,
``noise_scheduler.add_noise``, the UNet's noise prediction, ``F.mse_loss``, ``accelerator.backward`` (a plain
``backward`` with Accelerate's ``mixed_precision="no"`` default on one device), ``clip_grad_norm_(1.0)``,
``optimizer.step()``, ``lr_scheduler.step()``, ``ema_model.step(...)``, ``optimizer.zero_grad()``. The UNet,
scheduler and EMA come from the diffusers package (0.42.1; its ``EMAModel`` takes the parameters where the
2022 script passed the model, and keeps the same one copy).

Shrunk for CI: 16x16 images, batch 2, two resolution levels with 32 / 64 channels, one ResNet layer per
block, 8 normalisation groups (the script: 64x64, batch 16, six levels of 128…512 channels, 2 layers per
block).
"""
import torch
import torch.nn.functional as F
from diffusers import DDPMScheduler, UNet2DModel
from diffusers.optimization import get_scheduler
from diffusers.training_utils import EMAModel

SIDE, BATCH = 16, 2


def model():
    return UNet2DModel(sample_size=SIDE, in_channels=3, out_channels=3, layers_per_block=1,
                       block_out_channels=(32, 64), norm_num_groups=8,
                       down_block_types=("DownBlock2D", "AttnDownBlock2D"),
                       up_block_types=("AttnUpBlock2D", "UpBlock2D"))


def ddpm_unet():
    device = torch.device("cuda")
    net = model().to(device)
    noise_scheduler = DDPMScheduler(num_train_timesteps=1000)
    optimizer = torch.optim.AdamW(net.parameters(), lr=1e-4, betas=(0.95, 0.999), weight_decay=1e-6, eps=1e-8)
    lr_scheduler = get_scheduler("cosine", optimizer=optimizer, num_warmup_steps=500, num_training_steps=10_000)
    ema_model = EMAModel(net.parameters(), inv_gamma=1.0, power=3 / 4, decay=0.9999)
    ema_model.to(device)
    clean_cpu = torch.randn(BATCH, 3, SIDE, SIDE)
    net.train()

    def step():
        clean_images = clean_cpu.to(device)
        noise = torch.randn(clean_images.shape).to(clean_images.device)
        timesteps = torch.randint(0, noise_scheduler.config.num_train_timesteps, (BATCH,),
                                  device=clean_images.device).long()
        noisy_images = noise_scheduler.add_noise(clean_images, noise, timesteps)
        noise_pred = net(noisy_images, timesteps).sample
        loss = F.mse_loss(noise_pred, noise)
        loss.backward()
        torch.nn.utils.clip_grad_norm_(net.parameters(), 1.0)
        optimizer.step()
        lr_scheduler.step()
        ema_model.step(net.parameters())
        optimizer.zero_grad()
        return loss
    return step
