"""x-transformers' enwik8 character-level training step, with gradient accumulation (lucidrains/x-transformers
at 944c2becb23c, ``train_enwik8.py``, MIT licence).

Reproduced in this file's own words: ``AutoregressiveWrapper(TransformerWrapper(num_tokens=256, max_seq_len,
attn_layers=Decoder(dim, depth, heads, rotary_pos_emb=True)))`` moved with ``.cuda()`` (both classes from the
x-transformers package, 2.31.10), ``torch.optim.Adam(lr=1e-4)``, and one iteration of the loop: for each of
``GRADIENT_ACCUMULATE_EVERY = 4`` micro-batches, a batch of sequences each moved with ``.cuda()`` by the
dataset's ``__getitem__``, the wrapper's forward (which shifts the sequence into input and target and
returns the cross-entropy), ``(loss / 4).backward()``; then ``loss.item()`` printed, ``clip_grad_norm_(0.5)``,
``optim.step()``, ``optim.zero_grad()``.

Shrunk for CI: dim 64, depth 2, 4 heads, sequences of 64 + 1 bytes, batch 2 (the script: 512 / 6 / 8,
1024 + 1, batch 4). Four accumulation steps as the script.
"""
import torch
from x_transformers import Decoder, TransformerWrapper
from x_transformers.autoregressive_wrapper import AutoregressiveWrapper

BATCH, ACCUM, SEQ, DIM, DEPTH, HEADS = 2, 4, 64, 64, 2, 4


def model():
    return AutoregressiveWrapper(TransformerWrapper(num_tokens=256, max_seq_len=SEQ,
                                                    attn_layers=Decoder(dim=DIM, depth=DEPTH, heads=HEADS,
                                                                        rotary_pos_emb=True)))


def x_transformers_enwik8():
    net = model()
    net.cuda()
    optim = torch.optim.Adam(net.parameters(), lr=1e-4)
    data = torch.randint(0, 256, (10_000,), dtype=torch.uint8)

    def sample():
        start = int(torch.randint(0, data.size(0) - SEQ - 1, (1,)))
        return data[start: start + SEQ + 1].long().cuda()

    def step():
        net.train()
        for _ in range(ACCUM):
            loss = net(torch.stack([sample() for _ in range(BATCH)]))
            (loss / ACCUM).backward()
        print(f"training loss: {loss.item()}")
        torch.nn.utils.clip_grad_norm_(net.parameters(), 0.5)
        optim.step()
        optim.zero_grad()
    return step
