"""BERT masked-language-model pre-training as ``run_mlm_no_trainer.py`` runs it (huggingface/transformers at
cbeb5d01b54d, ``examples/pytorch/language-modeling/run_mlm_no_trainer.py``, Apache-2.0 licence), under
Accelerate.

Reproduced in this file's own words: ``AutoModelForMaskedLM.from_config`` (here ``BertForMaskedLM``: its MLM
head's decoder tied to the word embeddings), AdamW over two groups (``bias`` and ``LayerNorm.weight`` not
decayed, the rest 0.0 decay by the script's default), a linear schedule, ``accelerator.prepare(model,
optimizer, train_dataloader, lr_scheduler)`` — which places the model on the accelerator's device — and
the loop body under ``accelerator.accumulate(model)``: forward with the collator's masked ``input_ids`` and
``labels`` (-100 where unmasked: ``DataCollatorForLanguageModeling(mlm_probability=0.15)``, built on the host
as the dataloader does), ``accelerator.backward(loss)``, ``optimizer.step()``, ``lr_scheduler.step()``,
``optimizer.zero_grad()``. The model is the transformers package's; the collator's masking runs on the CPU
in the script's dataloader and is reproduced as a host-side mask.

Shrunk for CI: hidden 64, 2 layers, 2 heads, intermediate 128, vocab 512, batch 2 x 64 tokens (bert-base:
768 / 12 / 12 / 3072 / 30522; the script's default batch 8 x max_seq_length).
"""
import torch
from accelerate import Accelerator
from transformers import BertConfig, BertForMaskedLM, get_scheduler

BATCH, SEQ = 2, 64
CONFIG = dict(vocab_size=512, hidden_size=64, num_hidden_layers=2, num_attention_heads=2, intermediate_size=128,
              max_position_embeddings=64)


def model():
    return BertForMaskedLM(BertConfig(**CONFIG))


def masked_batch():
    ids = torch.randint(5, CONFIG["vocab_size"], (BATCH, SEQ))
    chosen = torch.rand(BATCH, SEQ) < 0.15
    labels = torch.where(chosen, ids, torch.full_like(ids, -100))
    return {"input_ids": torch.where(chosen, torch.full_like(ids, 4), ids), "attention_mask": torch.ones_like(ids),
            "token_type_ids": torch.zeros_like(ids), "labels": labels}


def bert_mlm():
    accelerator = Accelerator(gradient_accumulation_steps=1)
    net = model()
    no_decay = ["bias", "LayerNorm.weight"]
    groups = [{"params": [p for n, p in net.named_parameters() if not any(nd in n for nd in no_decay)],
               "weight_decay": 0.0},
              {"params": [p for n, p in net.named_parameters() if any(nd in n for nd in no_decay)],
               "weight_decay": 0.0}]
    optimizer = torch.optim.AdamW(groups, lr=5e-5)
    lr_scheduler = get_scheduler("linear", optimizer=optimizer, num_warmup_steps=0, num_training_steps=100)
    net, optimizer, lr_scheduler = accelerator.prepare(net, optimizer, lr_scheduler)
    net.train()
    batch_cpu = masked_batch()

    def step():
        batch = {k: v.to(accelerator.device) for k, v in batch_cpu.items()}
        with accelerator.accumulate(net):
            loss = net(**batch).loss
            accelerator.backward(loss)
            optimizer.step()
            lr_scheduler.step()
            optimizer.zero_grad()
        return loss
    return step
