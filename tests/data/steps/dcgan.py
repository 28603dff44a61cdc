"""The DCGAN example's training step (pytorch/examples at 493da9304e56, ``dcgan/main.py``, BSD-3-Clause
licence): two networks, two optimizers, three backward passes per step.

Reproduced in this file's own words: the generator (``ConvTranspose2d`` stack nz→8·ngf→…→nc with BatchNorm +
ReLU, Tanh out) and discriminator (``Conv2d`` stack with LeakyReLU(0.2) and BatchNorm, Sigmoid out), the
``weights_init`` normal init, ``BCELoss``, ``Adam(lr=2e-4, betas=(0.5, 0.999))`` for each, and the loop body:
``netD.zero_grad()``; real batch → D → loss → backward; ``D_x = output.mean().item()``; noise →
``fake = netG(noise)``; ``label.fill_(fake_label)``; ``netD(fake.detach())`` → backward; ``optimizerD.step()``;
``netG.zero_grad()``; ``label.fill_(real_label)``; ``netD(fake)`` → backward through both networks;
``optimizerG.step()``.

Shrunk for CI: nz 16, ngf = ndf = 8, batch 4 (the script: 100, 64, 64, batch 64); 64x64 RGB images as
the script's default ``--imageSize 64``.
"""
import torch
import torch.nn as nn

NZ, NGF, NDF, NC, BATCH = 16, 8, 8, 3, 4


class Generator(nn.Module):
    def __init__(self):
        super().__init__()
        layers, cin = [], NZ
        for i, mult in enumerate((8, 4, 2, 1)):
            layers += [nn.ConvTranspose2d(cin, NGF * mult, 4, 1 if i == 0 else 2, 0 if i == 0 else 1, bias=False),
                       nn.BatchNorm2d(NGF * mult), nn.ReLU(True)]
            cin = NGF * mult
        self.main = nn.Sequential(*layers, nn.ConvTranspose2d(cin, NC, 4, 2, 1, bias=False), nn.Tanh())

    def forward(self, z):
        return self.main(z)


class Discriminator(nn.Module):
    def __init__(self):
        super().__init__()
        layers, cin = [nn.Conv2d(NC, NDF, 4, 2, 1, bias=False), nn.LeakyReLU(0.2, inplace=True)], NDF
        for mult in (2, 4, 8):
            layers += [nn.Conv2d(cin, NDF * mult, 4, 2, 1, bias=False), nn.BatchNorm2d(NDF * mult),
                       nn.LeakyReLU(0.2, inplace=True)]
            cin = NDF * mult
        self.main = nn.Sequential(*layers, nn.Conv2d(cin, 1, 4, 1, 0, bias=False), nn.Sigmoid())

    def forward(self, x):
        return self.main(x).view(-1, 1).squeeze(1)


def init_weights(m):
    if "Conv" in type(m).__name__:
        nn.init.normal_(m.weight, 0.0, 0.02)
    elif "BatchNorm" in type(m).__name__:
        nn.init.normal_(m.weight, 1.0, 0.02)
        nn.init.zeros_(m.bias)


def model():
    return Generator(), Discriminator()


def dcgan():
    device = torch.device("cuda:0")
    netG, netD = (m.to(device) for m in model())
    netG.apply(init_weights)
    netD.apply(init_weights)
    criterion = nn.BCELoss()
    optimizerD = torch.optim.Adam(netD.parameters(), lr=2e-4, betas=(0.5, 0.999))
    optimizerG = torch.optim.Adam(netG.parameters(), lr=2e-4, betas=(0.5, 0.999))
    real_cpu = torch.randn(BATCH, NC, 64, 64)

    def step():
        netD.zero_grad()
        real = real_cpu.to(device)
        label = torch.full((BATCH,), 1.0, dtype=real.dtype, device=device)
        output = netD(real)
        err_real = criterion(output, label)
        err_real.backward()
        d_x = output.mean().item()
        noise = torch.randn(BATCH, NZ, 1, 1, device=device)
        fake = netG(noise)
        label.fill_(0.0)
        output = netD(fake.detach())
        err_fake = criterion(output, label)
        err_fake.backward()
        d_g_z1 = output.mean().item()
        err_d = err_real + err_fake
        optimizerD.step()
        netG.zero_grad()
        label.fill_(1.0)
        output = netD(fake)
        err_g = criterion(output, label)
        err_g.backward()
        d_g_z2 = output.mean().item()
        optimizerG.step()
        return err_d, err_g, d_x, d_g_z1, d_g_z2
    return step
