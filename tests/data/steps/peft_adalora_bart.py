"""PEFT's AdaLoRA sequence-to-sequence example (huggingface/peft at 000f631b9a07,
``examples/conditional_generation/peft_adalora_seq2seq.py``, Apache-2.0 licence): a frozen BART with
trainable low-rank adapters, the adapters' rank budget reallocated every step.

Reproduced in this file's own words: ``get_peft_model(model, AdaLoraConfig(init_r=12, target_r=8, beta1=0.85,
beta2=0.85, tinit=200, tfinal=1000, deltaT=10, lora_alpha=32, lora_dropout=0.1, task_type=SEQ_2_SEQ_LM))``
on ``AutoModelForSeq2SeqLM`` (BART), ``torch.optim.AdamW(model.parameters(), lr=1e-3)`` over *all* parameters
(frozen ones included: torch.optim skips a parameter whose ``.grad`` is None, so they get no state), a
linear warm-up schedule, ``model.to(device)``, and the loop body: batch dict moved with ``.to(device)``,
forward, ``total_loss += loss.detach().float()``, ``loss.backward()``, ``optimizer.step()``,
``lr_scheduler.step()``, ``model.base_model.update_and_allocate(global_step)``, ``optimizer.zero_grad()``.
The model comes from the transformers package (``BartForConditionalGeneration``) and the adapters from the
peft package (0.21.2).

Shrunk for CI: a randomly initialised BART with d_model 64, 2 + 2 layers, 4 heads, FFN 128, vocab 512,
batch 2 x 32 source and 3 label tokens (the script: facebook/bart-base, batch 8, max_length 128; labels
padded to 3 as its ``preprocess_function`` does).
"""
import torch
from peft import AdaLoraConfig, TaskType, get_peft_model
from transformers import BartConfig, BartForConditionalGeneration, get_linear_schedule_with_warmup

BATCH, SRC, TGT, STEPS = 2, 32, 3, 2000
CONFIG = dict(vocab_size=512, d_model=64, encoder_layers=2, decoder_layers=2, encoder_attention_heads=4,
              decoder_attention_heads=4, encoder_ffn_dim=128, decoder_ffn_dim=128, max_position_embeddings=64)


def base():
    return BartForConditionalGeneration(BartConfig(**CONFIG))


def model():
    cfg = AdaLoraConfig(init_r=12, target_r=8, beta1=0.85, beta2=0.85, tinit=200, tfinal=1000, deltaT=10,
                        lora_alpha=32, lora_dropout=0.1, task_type=TaskType.SEQ_2_SEQ_LM, inference_mode=False,
                        total_step=STEPS)
    return get_peft_model(base(), cfg)


def peft_adalora_bart():
    device = "cuda"
    net = model()
    optimizer = torch.optim.AdamW(net.parameters(), lr=1e-3)
    lr_scheduler = get_linear_schedule_with_warmup(optimizer=optimizer, num_warmup_steps=0, num_training_steps=STEPS)
    net = net.to(device)
    net.train()
    ids = torch.randint(4, 512, (BATCH, SRC))
    batch_cpu = {"input_ids": ids, "attention_mask": torch.ones_like(ids), "labels": torch.randint(4, 512, (BATCH, TGT))}
    state = {"global_step": 0, "total_loss": 0}

    def step():
        batch = {k: v.to(device) for k, v in batch_cpu.items()}
        loss = net(**batch).loss
        state["total_loss"] += loss.detach().float()
        loss.backward()
        optimizer.step()
        lr_scheduler.step()
        net.base_model.update_and_allocate(state["global_step"])
        optimizer.zero_grad()
        state["global_step"] += 1
    return step
