"""The VAE example's training step (pytorch/examples at cd01f93000a6, ``vae/main.py``, BSD-3-Clause licence).

Reproduced in this file's own words: the fully connected ``VAE`` (``fc1`` 784→400, ``fc21`` / ``fc22`` 400→20
for mean and log-variance, ``fc3`` 20→400, ``fc4`` 400→784, sigmoid output), the reparameterisation with
``torch.randn_like``, the loss (binary cross-entropy summed over pixels plus the KL term), ``Adam(lr=1e-3)``
and ``train()``'s body: ``data.to(device)``, ``optimizer.zero_grad()``, forward, loss, ``backward``,
``train_loss += loss.item()``, ``optimizer.step()``.

The script's model at full size; batch 8 for CI (the script: 128).
"""
import torch
import torch.nn as nn
import torch.nn.functional as F

BATCH = 8


class VAE(nn.Module):
    def __init__(self):
        super().__init__()
        self.fc1, self.fc21, self.fc22 = nn.Linear(784, 400), nn.Linear(400, 20), nn.Linear(400, 20)
        self.fc3, self.fc4 = nn.Linear(20, 400), nn.Linear(400, 784)

    def forward(self, x):
        h = F.relu(self.fc1(x.view(-1, 784)))
        mu, logvar = self.fc21(h), self.fc22(h)
        z = mu + torch.randn_like(logvar) * torch.exp(0.5 * logvar)
        return torch.sigmoid(self.fc4(F.relu(self.fc3(z)))), mu, logvar


def model():
    return VAE()


def vae():
    device = torch.device("cuda")
    net = model().to(device)
    optimizer = torch.optim.Adam(net.parameters(), lr=1e-3)
    data_cpu = torch.rand(BATCH, 1, 28, 28)
    state = {"train_loss": 0.0}
    net.train()

    def step():
        data = data_cpu.to(device)
        optimizer.zero_grad()
        recon, mu, logvar = net(data)
        bce = F.binary_cross_entropy(recon, data.view(-1, 784), reduction="sum")
        loss = bce - 0.5 * torch.sum(1 + logvar - mu.pow(2) - logvar.exp())
        loss.backward()
        state["train_loss"] += loss.item()
        optimizer.step()
    return step
