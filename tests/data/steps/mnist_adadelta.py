"""The MNIST example's training step (pytorch/examples at 493da9304e56, ``mnist/main.py``, BSD-3-Clause
licence): a small CNN under Adadelta.

Reproduced in this file's own words: ``Net`` (conv 1→32 3x3, ReLU, conv 32→64 3x3, ReLU, 2x2 max-pool,
Dropout(0.25), flatten, fc 9216→128, ReLU, Dropout(0.5), fc 128→10, ``log_softmax``), ``optimizer =
optim.Adadelta(model.parameters(), lr=1.0)`` (two states per parameter: ``square_avg`` and ``acc_delta``),
and ``train()``'s body: ``data.to(device)``, ``target.to(device)``, ``optimizer.zero_grad()``, forward,
``F.nll_loss``, ``loss.backward()``, ``optimizer.step()``.

Shrunk for CI: batch 8 (the script: 64). The network is the script's, full size.
"""
import torch
import torch.nn as nn
import torch.nn.functional as F

BATCH = 8


class Net(nn.Module):
    def __init__(self):
        super().__init__()
        self.conv1, self.conv2 = nn.Conv2d(1, 32, 3, 1), nn.Conv2d(32, 64, 3, 1)
        self.dropout1, self.dropout2 = nn.Dropout(0.25), nn.Dropout(0.5)
        self.fc1, self.fc2 = nn.Linear(9216, 128), nn.Linear(128, 10)

    def forward(self, x):
        x = F.max_pool2d(F.relu(self.conv2(F.relu(self.conv1(x)))), 2)
        x = F.relu(self.fc1(torch.flatten(self.dropout1(x), 1)))
        return F.log_softmax(self.fc2(self.dropout2(x)), dim=1)


def model():
    return Net()


def mnist_adadelta():
    device = torch.device("cuda")
    net = model().to(device)
    optimizer = torch.optim.Adadelta(net.parameters(), lr=1.0)
    data_cpu, target_cpu = torch.randn(BATCH, 1, 28, 28), torch.randint(10, (BATCH,))
    net.train()

    def step():
        data, target = data_cpu.to(device), target_cpu.to(device)
        optimizer.zero_grad()
        loss = F.nll_loss(net(data), target)
        loss.backward()
        optimizer.step()
        return loss
    return step
