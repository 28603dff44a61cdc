"""T5 fine-tuning as the T5 repository's PyTorch path trains it (google-research/text-to-text-transfer-transformer
at 03fabf0bf82b, ``t5/models/hf_model.py: HfPyTorchModel.train``, Apache-2.0 licence), under Adafactor.

Reproduced in this file's own words: ``train()``'s loop body — ``model.zero_grad()`` first, the forward of
``T5ForConditionalGeneration`` with encoder input ids and mask, decoder attention mask and labels (the
batch turned into device tensors by ``to_tensor``), ``loss.backward()``, ``optimizer.step()`` — with the
optimizer the class docstring suggests, ``transformers.Adafactor(lr=1e-3, relative_step=False)`` (whose
``scale_parameter=True`` default and factored second moments keep, per ≥2-D parameter, a row and a column
vector, and per 1-D parameter a full ``exp_avg_sq``; no first moment with ``beta1=None``). The model is the
transformers package's ``T5ForConditionalGeneration`` (encoder-decoder, relative position buckets, shared
embedding tied to both stacks' ``embed_tokens``; ``tie_word_embeddings`` on, as T5 v1.0).

Shrunk for CI: d_model 64, d_ff 128, 2 + 2 layers, 4 heads, d_kv 16, vocab 256, batch 2, 32 input and 8
target tokens (t5-small: 512 / 2048 / 6 + 6 / 8 / 64 / 32128).
"""
import torch
from transformers import T5Config, T5ForConditionalGeneration
from transformers.optimization import Adafactor

BATCH, SRC, TGT = 2, 32, 8
CONFIG = dict(vocab_size=256, d_model=64, d_kv=16, d_ff=128, num_layers=2, num_decoder_layers=2, num_heads=4,
              decoder_start_token_id=0, pad_token_id=0)


def model():
    return T5ForConditionalGeneration(T5Config(**CONFIG))


def t5_adafactor():
    device = torch.device("cuda")
    net = model().to(device)
    net.train()
    optimizer = Adafactor(net.parameters(), lr=1e-3, relative_step=False)
    batch = {"inputs": torch.randint(1, 256, (BATCH, SRC)), "targets": torch.randint(1, 256, (BATCH, TGT))}

    def to_tensor(x):
        return x.to(device)

    def step():
        net.zero_grad()
        out = net(input_ids=to_tensor(batch["inputs"]), attention_mask=to_tensor(torch.ones(BATCH, SRC)),
                  decoder_attention_mask=to_tensor(torch.ones(BATCH, TGT)), labels=to_tensor(batch["targets"]))
        loss = out[0]
        loss.backward()
        optimizer.step()
        return loss
    return step
