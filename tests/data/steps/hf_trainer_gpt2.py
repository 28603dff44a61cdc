"""A Hugging Face ``Trainer`` training step, as ``run_clm.py`` trains GPT-2 (huggingface/transformers at
0851a87dd4a4, ``examples/pytorch/language-modeling/run_clm.py``, and ``src/transformers/trainer.py``, Apache-2.0
licence;
the step is the installed transformers 5.24.0's own ``Trainer.training_step``).

Reproduced: ``run_clm.py`` builds ``AutoModelForCausalLM.from_config`` (here ``GPT2LMHeadModel``: tied
``wte``/``lm_head``, Conv1D projections, eager attention as configured below) and hands it to ``Trainer``
with ``TrainingArguments``; the Trainer moves the model to ``args.device``, builds AdamW over its two
decay groups (``create_optimizer_and_scheduler``; the default ``optim`` is ``adamw_torch_fused``) and lets Accelerate wrap model and optimizer. One step of
``Trainer._inner_training_loop``: ``training_step`` (the Trainer's own: ``_prepare_inputs`` moves the batch
to the device, ``compute_loss``, ``accelerator.backward``), the gradient clipping at ``max_grad_norm=1.0``,
``optimizer.step()``, ``lr_scheduler.step()``, ``model.zero_grad()``; the batch's label count
``num_items_in_batch`` is a device tensor, as ``get_batch_samples`` computes it.

Shrunk for CI: 2 layers, 2 heads, width 64, 64 positions, vocab 512, batch 2 x 64 tokens (run_clm:
GPT-2's 12/12/768, block size 1024, vocab 50257, batch 8). ``--bf16`` off (run_clm's default).
"""
import tempfile

import torch
from transformers import GPT2Config, GPT2LMHeadModel, Trainer, TrainingArguments

BATCH, SEQ = 2, 64
CONFIG = dict(vocab_size=512, n_positions=64, n_embd=64, n_layer=2, n_head=2)


def model():
    return GPT2LMHeadModel(GPT2Config(**CONFIG))


def hf_trainer_gpt2():
    args = TrainingArguments(output_dir=tempfile.mkdtemp(), per_device_train_batch_size=BATCH, max_steps=10,
                             report_to=[], logging_strategy="no", save_strategy="no", max_grad_norm=1.0,
                             dataloader_pin_memory=False)
    trainer = Trainer(model=model(), args=args)
    trainer.create_optimizer_and_scheduler(num_training_steps=args.max_steps)
    net, trainer.optimizer = trainer.accelerator.prepare(trainer.model, trainer.optimizer)
    ids = torch.randint(CONFIG["vocab_size"], (BATCH, SEQ))
    batch = {"input_ids": ids, "attention_mask": torch.ones_like(ids), "labels": ids.clone()}

    def step():
        inputs = dict(batch)
        count = (inputs["labels"].to(args.device) != -100).sum()
        trainer.training_step(net, inputs, count)
        trainer.accelerator.clip_grad_norm_(net.parameters(), args.max_grad_norm)
        trainer.optimizer.step()
        trainer.lr_scheduler.step()
        net.zero_grad()
    return step
