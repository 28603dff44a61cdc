"""``megatron`` profile on Megatron-Core's BERT (``graph/families/bert.py``, ``profiles/megatron_bert.py``): the shape of
Megatron-LM's ``bert_mcore_*`` functional tests (hidden 1024, 16 heads, GeLU MLP 4096, LayerNorm, learned positions,
vocabulary 30,522, micro-batch 4 × 512 tokens, dropout 0.1, TE's unfused attention), two layers, TP 2 without
sequence parallelism over two pipeline stages. Parameters and saved tensors are the sums of the shapes the cited
sources give, to the byte."""

from __future__ import annotations

import pytest
from helpers_run import edited_run
from sources import template_of

from timeline.errors import UserError
from timeline.graph.analytic import AnalyticSource

B, S, H, HEADS, FFN, TP = 4, 512, 1024, 16, 4096, 2
V_PAD = 30720  # 30,522 padded to a multiple of 128 · tp
T = B * S  # token rows
RUN = f"""[model]
preset = "megatron-gpt"
architecture = "bert"
binary_head = true
type_vocab_size = 2
num_layers = 2
hidden_size = {H}
num_attention_heads = {HEADS}
intermediate_size = {FFN}
vocab_size = 30522
max_position_embeddings = {S}
[parallel]
tp = {TP}
pp = 2
sp = false
[training]
micro_batch_size = {B}
seq_len = {S}
num_microbatches = 2
[framework]
attention_backend = "unfused"
dataloader_batch = "tokens"
transformer_engine = "{{te}}"
"""


def _run(tmp_path, te: str = "2.6", **edits: str):
    return edited_run(tmp_path, RUN.format(te=te), **edits)


@pytest.fixture(scope="module")
def run(tmp_path_factory):
    return _run(tmp_path_factory.mktemp("bert"))


def _params(run, chunk: int) -> dict:
    src = AnalyticSource(model=run.model, profile="megatron", framework=run.framework, parallel=run.parallel,
                         training=run.training)
    return {t.name: t.shape for n in src.nodes(chunk) for t in n.params}


def test_bert_parameters_per_stage(run):
    """First stage: word embeddings [V/tp, h], positions [512, h], token types [2, h] (BertModel.__init__'s
    LanguageModelEmbedding with num_tokentypes = 2) and a GPT-shaped TE layer; last stage: the final norm,
    BertLMHead (dense [h, h] + bias, LayerNorm), the word-embedding copy and the output layer's bias [V/tp],
    the pooler's dense and the binary head [2, h] + [2]."""
    first, last = _params(run, 0), _params(run, 1)
    assert {k: v for k, v in first.items() if k.startswith("embedding")} == {
        "embedding.word_embeddings.weight": (V_PAD // TP, H), "embedding.position_embeddings.weight": (S, H),
        "embedding.tokentype_embeddings.weight": (2, H)}
    layer = {k.removeprefix("layers.0."): v for k, v in first.items() if k.startswith("layers.0.")}
    assert sum(_numel(v) for v in layer.values()) == (4 * H + 3 * H * H // TP + 3 * H // TP + H * H // TP + H
                                                      + 2 * FFN * H // TP + FFN // TP + H)
    head = {k: v for k, v in last.items() if not k.startswith("layers.")}
    assert head == {"final_norm.weight": (H,), "final_norm.bias": (H,), "lm_head.dense.weight": (H, H),
                    "lm_head.dense.bias": (H,), "lm_head.layer_norm.weight": (H,), "lm_head.layer_norm.bias": (H,),
                    "output_layer.weight": (V_PAD // TP, H), "output_layer.bias": (V_PAD // TP,),
                    "pooler.dense.weight": (H, H), "pooler.dense.bias": (H,), "binary_head.weight": (2, H),
                    "binary_head.bias": (2,)}


def _numel(shape: tuple[int, ...]) -> int:
    out = 1
    for n in shape:
        out *= n
    return out


def _layer_bytes(heads: int) -> int:
    """One layer at tp 2 (heads: local heads): TE LayerNormLinear's input, ln_out and fp32 mu/rsigma (twice),
    the fused QKV output the unfused attention's views keep, the fused softmax's bf16 output, the padding mask
    masked_fill keeps ([b, 1, s, s] bool), attention dropout's mask and output, linear_proj's input, fc1's output
    (the fused bias-GeLU's input), fc2's input, two bias-dropout-add masks."""
    norms = 2 * (2 * T * H + 4 * T + 4 * T + 2 * T * H)
    attention = 2 * T * 3 * H // TP + 2 * B * heads * S * S + B * S * S + B * heads * S * S + 2 * B * heads * S * S
    return norms + attention + 2 * T * H // TP + 2 * 2 * T * FFN // TP + 2 * T * H


def test_bert_layer_saves_what_the_sources_say(run):
    tpl = template_of(run, 1)
    assert template_of(run, 0).layer_activation_bytes[0] == tpl.layer_activation_bytes[1] == _layer_bytes(HEADS // TP)
    saved = {st.tensor.name: st for st in tpl.saved if st.layer == 1}
    mask = saved["layers.1.self_attn.core_attn.mask.full"]
    assert (mask.tensor.shape, mask.tensor.dtype, mask.op) == ((B, 1, S, S), "bool",
                                                               "layers.1.self_attn.core_attn.masked_fill")


def test_bert_head_saves_what_the_sources_say(run):
    """The final norm's input and statistics and its output (kept by the LM head's dense and, through the
    select view, the pooler's), the pooler's tanh output, GeLU's input, the LM head LayerNorm's input and
    statistics, the output layer's input, the loss's fp32 softmax numerators, target mask and masked targets;
    the binary head's input is the tanh output already kept."""
    tpl = template_of(run, 1)
    head = 2 * T * H + 8 * T + 2 * T * H + 2 * B * H + 2 * T * H + 2 * T * H + 8 * T + 2 * T * H
    loss = 4 * T * V_PAD // TP + T + 8 * T
    assert tpl.layer_activation_bytes[-1] == head + loss


def _mask_ops(tpl) -> list[tuple[str, int]]:
    return [(op.name.rsplit(".", 1)[-1], sum(t.size_bytes for t in op.allocs)) for op in tpl.forward
            if op.name.startswith("layers.0.self_attn.core_attn.mask.")]


def test_te2_widens_the_padding_mask_through_int32_window_bounds(tmp_path):
    """TE ≥ 2.0 get_full_mask: logical_or and logical_not [b, 1, s, s] bool, the arange difference [1, 1, s, s]
    int32, swa_left/right [b, 1, s, s] int32, three bool comparisons, the bool and, its not, the final or;
    TE 1.11 stops after the arange difference (kept by its local to the end of forward)."""
    bss = B * S * S
    assert _mask_ops(template_of(_run(tmp_path, "2.6"), 0)) == [
        ("pad", 2 * bss), ("diag", 4 * S * S), ("window", 2 * 4 * bss), ("compare", 3 * bss), ("and", bss),
        ("not", bss), ("or", bss)]
    assert _mask_ops(template_of(_run(tmp_path, "1.11"), 0)) == [("pad", 2 * bss), ("diag", 4 * S * S)]


def _local(tmp_path, te: str = "2.6"):
    """The same job under ``--spec local`` (``bert_layer_local_spec``: transformer_impl and attention "local")."""
    return _run(tmp_path, te, attention_backend='"local"\ntransformer_impl = "local"')


def test_the_local_spec_layer_reads_the_extended_mask_as_given(tmp_path):
    """bert_layer_local_spec: apex FusedLayerNorm (input, fp32 mean and rsigma) before ColumnParallelLinear (which
    keeps the norm's output), Megatron's DotProductAttention (q and k for baddbmm, the fused ScaledMaskedSoftmax's
    output, dropout's mask and output for bmm, v), no per-layer mask: the TE layer's bytes less its [b, 1, s, s]
    widened mask."""
    run = _local(tmp_path)
    tpl = template_of(run, 0)
    assert tpl.layer_activation_bytes[0] == _layer_bytes(HEADS // TP) - B * S * S
    assert not [op for op in tpl.forward if ".core_attn.mask" in op.name or op.name.endswith("masked_fill")]


def _batch_mask_ops(tpl) -> list[tuple[str, int, tuple[str, ...]]]:
    """(op, bytes it allocates, storages it frees) of the forward's extended-mask ops."""
    return [(op.name, sum(t.size_bytes for t in op.allocs), tuple(op.frees))
            for op in tpl.forward if op.name in ("batch.mask_product", "batch.extended_mask")]


def test_the_extended_mask_is_b1ss_through_an_int64_product_for_the_local_spec_and_te_before_1_10(tmp_path):
    """BertModel.bert_extended_attention_mask: "b1ss" multiplies the [b, 1, s] and [b, s, 1] views of the int64 padding
    mask (an int64 [b, s, s] product, freed as the function returns) and compares its [b, 1, s, s] view; "b11s" (TE ≥
    1.10) compares the [b, 1, 1, s] view."""
    b1ss = [("batch.mask_product", 8 * B * S * S, ()), ("batch.extended_mask", B * S * S, ("batch.mask_product",))]
    assert _batch_mask_ops(template_of(_local(tmp_path), 0)) == b1ss
    assert _batch_mask_ops(template_of(_run(tmp_path, "1.2"), 0)) == b1ss
    assert _batch_mask_ops(template_of(_run(tmp_path, "1.10"), 0)) == [("batch.extended_mask", B * S, ())]


def test_without_the_binary_head_there_is_no_pooler_and_no_token_type(tmp_path):
    run = _run(tmp_path, binary_head="false", type_vocab_size="0")
    assert not [k for k in _params(run, 1) if k.startswith(("pooler", "binary_head"))]
    assert "embedding.tokentype_embeddings.weight" not in _params(run, 0)
    assert not [op for op in template_of(run, 0).forward if "tokentype" in op.name]


@pytest.mark.parametrize(("edits", "key"), [
    ({"attention_backend": '"flash"'}, "framework.attention_backend"),
    ({"attention_backend": '"unfused"\ntransformer_impl = "local"'}, "framework.attention_backend"),
    ({"attention_backend": '"unfused"\nuse_legacy_models = true'}, "framework.use_legacy_models"),
    ({"attention_backend": '"local"\nuse_legacy_models = true'}, "framework.attention_backend"),
    ({"sp": "false\ncp = 2"}, "parallel.cp"),
    ({"binary_head": "false"}, "model.type_vocab_size"),
    ({"architecture": '"gpt"'}, "model.type_vocab_size"),
    ({"num_layers": "2\nn_routed_experts = 4\nmoe_intermediate_size = 512\nnum_experts_per_tok = 2"},
     "model.n_routed_experts"),
])
def test_what_bert_is_not_modelled_with_is_one_line_naming_the_key(tmp_path, edits, key):
    with pytest.raises(UserError) as exc:
        _run(tmp_path, **edits)
    assert key in str(exc.value)
