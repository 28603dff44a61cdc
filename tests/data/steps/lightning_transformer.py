"""A Lightning module's training step under Lightning's automatic optimization (Lightning-AI/pytorch-lightning,
the ``pytorch-lightning`` 2.6.6 package: ``pytorch_lightning/demos/transformer.py: LightningTransformer`` and
``pytorch_lightning/loops/optimization/automatic.py: _AutomaticOptimization`` / ``Closure``; Apache-2.0
licence).

The module is the package's own ``LightningTransformer`` (an ``nn.Transformer`` encoder-decoder, 2 + 2
layers, width 200, 2 heads, FFN 200, dropout 0.2, sinusoidal positions built lazily on the input's device,
a source mask cached on the module after the first step; ``configure_optimizers`` returns
``SGD(lr=0.1)`` without momentum, so no optimizer state). The step is written out as Lightning's
automatic optimization runs it, in this file's own words: the optimizer's ``step`` is called *with a
closure* (``LightningModule.optimizer_step`` → ``optimizer.step(closure=...)``), and the closure runs
``training_step`` (the forward and the NLL loss), then ``optimizer.zero_grad()`` — after the forward, before
the backward — then ``loss.backward()``; the optimizer's update follows inside the same ``step`` call.

Shrunk for CI: vocabulary 1000 (the demo's default is WikiText-2's 33,278), batch 4 x 35 tokens (its
``block_size``).
"""
import torch
from pytorch_lightning.demos.transformer import LightningTransformer

VOCAB, BATCH, BLOCK = 1000, 4, 35


def model():
    return LightningTransformer(vocab_size=VOCAB)


def lightning_transformer():
    device = torch.device("cuda", 0)
    module = model().to(device)
    module.train()
    optimizer = module.configure_optimizers()
    tokens = torch.randint(VOCAB, (BATCH, BLOCK + 1))
    batch = (tokens[:, :-1].to(device), tokens[:, 1:].to(device))

    def closure():
        loss = module.training_step(batch, 0)
        optimizer.zero_grad()
        loss.backward()
        return loss

    def step():
        optimizer.step(closure=closure)
    return step
