"""The super-resolution example's training step (pytorch/examples at 0722b2f4f73a, ``super_resolution/model.py``
and ``main.py``, BSD-3-Clause licence): an ESPCN-style sub-pixel CNN.

Reproduced in this file's own words: ``Net`` (5x5 conv 1→64, 3x3 conv 64→64, 3x3 conv 64→32, 3x3 conv
32→r², ReLUs, ``PixelShuffle(r)``; orthogonal init), ``nn.MSELoss``, ``optim.Adam(lr=0.01)`` and ``train()``'s
body: input and target ``.to(device)``, ``optimizer.zero_grad()``, forward, loss, ``epoch_loss +=
loss.item()``, ``loss.backward()``, ``optimizer.step()``.

The script's network at full width with ``--upscale_factor 3``; shrunk for CI: 16x16 inputs to 48x48
targets, batch 4 (the script: 85x85 crops of BSDS300, batch 64).
"""
import torch
import torch.nn as nn

UPSCALE, SIDE, BATCH = 3, 16, 4


class Net(nn.Module):
    def __init__(self):
        super().__init__()
        self.relu = nn.ReLU()
        self.conv1 = nn.Conv2d(1, 64, 5, 1, 2)
        self.conv2 = nn.Conv2d(64, 64, 3, 1, 1)
        self.conv3 = nn.Conv2d(64, 32, 3, 1, 1)
        self.conv4 = nn.Conv2d(32, UPSCALE ** 2, 3, 1, 1)
        self.pixel_shuffle = nn.PixelShuffle(UPSCALE)
        for conv, gain in ((self.conv1, 2 ** 0.5), (self.conv2, 2 ** 0.5), (self.conv3, 2 ** 0.5), (self.conv4, 1.0)):
            nn.init.orthogonal_(conv.weight, gain)

    def forward(self, x):
        x = self.relu(self.conv3(self.relu(self.conv2(self.relu(self.conv1(x))))))
        return self.pixel_shuffle(self.conv4(x))


def model():
    return Net()


def super_resolution():
    device = torch.device("cuda")
    net = model().to(device)
    criterion = nn.MSELoss()
    optimizer = torch.optim.Adam(net.parameters(), lr=0.01)
    low, high = torch.rand(BATCH, 1, SIDE, SIDE), torch.rand(BATCH, 1, SIDE * UPSCALE, SIDE * UPSCALE)
    state = {"epoch_loss": 0.0}

    def step():
        inputs, target = low.to(device), high.to(device)
        optimizer.zero_grad()
        loss = criterion(net(inputs), target)
        state["epoch_loss"] += loss.item()
        loss.backward()
        optimizer.step()
    return step
