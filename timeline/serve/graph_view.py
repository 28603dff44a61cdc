"""The model graph as an inference engine shards it: one device's parameters and forward ops.

An engine runs the whole model on each tensor-parallel group (``pp = 1``), no sequence
parallelism, and pads the vocabulary as vLLM's ``VocabParallelEmbedding`` does
(``vllm/model_executor/layers/vocab_parallel_embedding.py``: ``pad_vocab_size(vocab, 64)``, then
split by tp). Routed experts split over ``ep`` ranks whole (``etp = 1``) or, without EP, by tp
(vLLM ``FusedMoE``: ``tp_size`` shards the intermediate dimension). The training graph's
Megatron-style forward ops give every activation shape; nothing is saved for a backward.
"""

from __future__ import annotations

from dataclasses import replace

from timeline.graph.build import chunk_layers, chunk_nodes
from timeline.graph.context import BuildCtx
from timeline.graph.framework import framework
from timeline.graph.ir import FOp
from timeline.graph.template import forward_ops
from timeline.graph.tensors import TensorDef
from timeline.spec.run import RecomputeSpec, RunSpec, ScheduleSpec, TrainingSpec
from timeline.spec.serving import ServeRunSpec

#: vLLM ``DEFAULT_VOCAB_PADDING_SIZE``
VOCAB_PADDING = 64


def graph_run(run: ServeRunSpec, num_tokens: int) -> RunSpec:
    """A one-stage run whose forward pass is one engine step of ``num_tokens`` tokens."""
    par = run.parallel
    etp = 1 if par.ep > 1 else par.tp
    parallel = replace(par, pp=1, vpp=1, sp=False, cp=1, etp=etp, layout=None)
    return RunSpec(name=run.name, source=run.source, model=run.model, profile="megatron",
                   model_source=run.model_source, parallel=parallel,
                   training=TrainingSpec(micro_batch_size=1, seq_len=max(1, num_tokens), dtype=run.serving.dtype),
                   recompute=RecomputeSpec(), schedule=ScheduleSpec(), allocator=run.allocator,
                   hardware=run.hardware)


def build_ctx(g: RunSpec) -> BuildCtx:
    fw = framework("megatron")
    pad = max(1, VOCAB_PADDING // g.parallel.tp) if VOCAB_PADDING % g.parallel.tp == 0 else 1
    fw = replace(fw, params=replace(fw.params, vocab_pad=pad, shared_experts_tp_split=True, mtp_modules=False))
    p = g.parallel
    return BuildCtx(model=g.model, framework=fw, tp=p.tp, ep=p.ep, etp=p.etp, dtype=g.training.dtype)


def device_params(run: ServeRunSpec) -> list[TensorDef]:
    """Every parameter TensorDef one device holds (model dtype, before quantization)."""
    g = graph_run(run, 1)
    nodes = chunk_nodes(build_ctx(g), chunk_layers(g), 0)
    # vLLM loads no MTP module for plain decoding (it is a separate draft model)
    return [t for n in nodes if not n.name.startswith("mtp") for t in n.params]


def step_ops(run: ServeRunSpec, num_tokens: int) -> list[FOp]:
    """The forward ops of one step over ``num_tokens`` tokens, up to the final norm: the engine
    computes logits only for each request's last token (:mod:`timeline.serve.sampler`)."""
    g = graph_run(run, num_tokens)
    ops = forward_ops(g, 0, build_ctx(g))
    return [op for op in ops if not op.name.startswith(("output", "mtp"))]
