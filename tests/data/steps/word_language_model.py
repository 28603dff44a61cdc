"""The word-level language model example's training step (pytorch/examples at 493da9304e56,
``word_language_model/main.py`` and ``model.py``, BSD-3-Clause licence): a tied LSTM, updated by hand.

Reproduced in this file's own words: ``RNNModel`` (Dropout, ``Embedding``, a 2-layer ``nn.LSTM`` with dropout
between layers, ``decoder`` Linear whose weight is the embedding's under ``--tied``, ``log_softmax``
output) and ``train()``'s body: ``model.zero_grad()``, the hidden state detached from the previous batch
(``repackage_hidden``), forward, ``NLLLoss``, backward, ``clip_grad_norm_(clip=0.25)`` and the manual SGD
update ``p.data.add_(p.grad, alpha=-lr)`` — no optimizer object, so no optimizer state. The hidden state
carried from step to step is the one tensor pair that lives across iterations besides the model.

The script's defaults (emsize = nhid = 200, 2 layers, bptt 35, batch 20, dropout 0.2) with ``--tied``;
shrunk for CI: vocabulary 1000 (the script's is Wikitext-2's 33,278). On a GPU ``nn.LSTM`` runs cuDNN
(``_cudnn_rnn`` with a workspace and reserve space); the CPU capture records aten's LSTM instead, so the
LSTM's own intermediates are not what a GPU holds.
"""
import torch
import torch.nn as nn
import torch.nn.functional as F

VOCAB, EMB, NHID, LAYERS, BPTT, BATCH, CLIP, LR = 1000, 200, 200, 2, 35, 20, 0.25, 20.0


class RNNModel(nn.Module):
    def __init__(self):
        super().__init__()
        self.drop = nn.Dropout(0.2)
        self.encoder = nn.Embedding(VOCAB, EMB)
        self.rnn = nn.LSTM(EMB, NHID, LAYERS, dropout=0.2)
        self.decoder = nn.Linear(NHID, VOCAB)
        self.decoder.weight = self.encoder.weight  # --tied

    def forward(self, x, hidden):
        out, hidden = self.rnn(self.drop(self.encoder(x)), hidden)
        return F.log_softmax(self.decoder(self.drop(out)).view(-1, VOCAB), dim=1), hidden

    def init_hidden(self, bsz):
        w = next(self.parameters())
        return w.new_zeros(LAYERS, bsz, NHID), w.new_zeros(LAYERS, bsz, NHID)


def model():
    return RNNModel()


def word_language_model():
    device = torch.device("cuda")
    net = model().to(device)
    criterion = nn.NLLLoss()
    source = torch.randint(VOCAB, (BPTT + 1, BATCH)).to(device)
    state = {"hidden": net.init_hidden(BATCH)}
    net.train()

    def step():
        data, targets = source[:BPTT], source[1:BPTT + 1].reshape(-1)
        net.zero_grad()
        hidden = tuple(h.detach() for h in state["hidden"])
        output, state["hidden"] = net(data, hidden)
        loss = criterion(output, targets)
        loss.backward()
        torch.nn.utils.clip_grad_norm_(net.parameters(), CLIP)
        for p in net.parameters():
            p.data.add_(p.grad, alpha=-LR)
        return loss
    return step
