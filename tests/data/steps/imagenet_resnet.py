"""The ImageNet example's training step (pytorch/examples at 493da9304e56, ``imagenet/main.py``, BSD-3-Clause
licence) on a ResNet-18-shaped network.

Reproduced in this file's own words: ``main.py``'s ``train()`` iteration — ``images.to(device,
non_blocking=True)``, ``target.to(device, non_blocking=True)``, forward, ``nn.CrossEntropyLoss``, the top-1 /
top-5 ``accuracy`` (``output.topk(5, 1, True, True)`` compared with the target) and ``loss.item()`` for the
meters, ``optimizer.zero_grad()``, ``loss.backward()``, ``optimizer.step()`` — with its default optimizer,
``SGD(lr=0.1, momentum=0.9, weight_decay=1e-4)`` (one momentum buffer per parameter, torch.optim's default
implementation). The default ``--arch resnet18`` is torchvision's; torchvision cannot be imported beside
the CPU torch wheel here, so the ResNet-18 module tree (7x7 stem conv, BatchNorm, max-pool, four stages of
two BasicBlocks with 1x1 downsampling shortcuts, global average pool, ``fc``) is written out here, with its
BatchNorm running statistics and ``num_batches_tracked`` buffers.

Shrunk for CI: widths 16/32/64/128 (ResNet-18: 64/128/256/512), 64x64 images, batch 4, 100 classes
(the script: 224x224, batch 256, 1000 classes). fp32, no AMP.
"""
import torch
import torch.nn as nn

WIDTHS, CLASSES, BATCH, SIDE = (16, 32, 64, 128), 100, 4, 64


class BasicBlock(nn.Module):
    def __init__(self, cin, cout, stride):
        super().__init__()
        self.conv1 = nn.Conv2d(cin, cout, 3, stride, 1, bias=False)
        self.bn1 = nn.BatchNorm2d(cout)
        self.conv2 = nn.Conv2d(cout, cout, 3, 1, 1, bias=False)
        self.bn2 = nn.BatchNorm2d(cout)
        self.relu = nn.ReLU(inplace=True)
        self.downsample = None
        if stride != 1 or cin != cout:
            self.downsample = nn.Sequential(nn.Conv2d(cin, cout, 1, stride, bias=False), nn.BatchNorm2d(cout))

    def forward(self, x):
        skip = x if self.downsample is None else self.downsample(x)
        out = self.relu(self.bn1(self.conv1(x)))
        return self.relu(self.bn2(self.conv2(out)) + skip)


class ResNet18(nn.Module):
    def __init__(self):
        super().__init__()
        w = WIDTHS
        self.conv1 = nn.Conv2d(3, w[0], 7, 2, 3, bias=False)
        self.bn1, self.relu, self.maxpool = nn.BatchNorm2d(w[0]), nn.ReLU(inplace=True), nn.MaxPool2d(3, 2, 1)
        stages, cin = [], w[0]
        for i, cout in enumerate(w):
            stages.append(nn.Sequential(BasicBlock(cin, cout, 1 if i == 0 else 2), BasicBlock(cout, cout, 1)))
            cin = cout
        self.layer1, self.layer2, self.layer3, self.layer4 = stages
        self.avgpool = nn.AdaptiveAvgPool2d((1, 1))
        self.fc = nn.Linear(w[-1], CLASSES)

    def forward(self, x):
        x = self.maxpool(self.relu(self.bn1(self.conv1(x))))
        x = self.layer4(self.layer3(self.layer2(self.layer1(x))))
        return self.fc(torch.flatten(self.avgpool(x), 1))


def model():
    return ResNet18()


def accuracy(output, target, topk=(1, 5)):
    with torch.no_grad():
        _, pred = output.topk(max(topk), 1, True, True)
        correct = pred.t().eq(target.view(1, -1).expand_as(pred.t()))
        return [correct[:k].reshape(-1).float().sum(0, keepdim=True) * (100.0 / target.size(0)) for k in topk]


def imagenet_resnet():
    device = torch.device("cuda")
    net = model().to(device)
    criterion = nn.CrossEntropyLoss().to(device)
    optimizer = torch.optim.SGD(net.parameters(), 0.1, momentum=0.9, weight_decay=1e-4)
    images_cpu, target_cpu = torch.randn(BATCH, 3, SIDE, SIDE), torch.randint(CLASSES, (BATCH,))
    net.train()

    def step():
        images = images_cpu.to(device, non_blocking=True)
        target = target_cpu.to(device, non_blocking=True)
        output = net(images)
        loss = criterion(output, target)
        acc1, acc5 = accuracy(output, target)
        meters = (loss.item(), acc1[0].item(), acc5[0].item())
        optimizer.zero_grad()
        loss.backward()
        optimizer.step()
        return meters
    return step
