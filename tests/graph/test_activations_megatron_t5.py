"""``megatron`` profile on Megatron-Core's T5 (``graph/families/t5.py``): the shape of Megatron-LM's ``t5_220m``
functional tests (hidden 768, 12 heads, GeLU MLP 3072, LayerNorm, learned positions, BertWordPieceCase with 100
sentinels: 29,098 tokens, micro-batch 4 × 512 encoder and 128 decoder tokens, dropout 0.1, TE's unfused
attention), one encoder and one decoder layer, TP 2 without sequence parallelism. Parameters and saved tensors are
the sums of the shapes the cited sources give, to the byte."""

from __future__ import annotations

import pytest
from helpers_run import edited_run
from sources import forward_ops_of, template_of

from timeline.errors import UserError
from timeline.graph.analytic import AnalyticSource

B, SE, SD, H, HEADS, FFN, TP = 4, 512, 128, 768, 12, 3072, 2
V_PAD = 29184  # 29,098 padded to a multiple of 128 · tp
TE_ROWS, TD_ROWS = B * SE, B * SD  # encoder and decoder token rows
NP = HEADS // TP
RUN = f"""[model]
preset = "megatron-gpt"
architecture = "t5"
encoder_layers = 1
num_layers = 2
hidden_size = {H}
num_attention_heads = {HEADS}
intermediate_size = {FFN}
vocab_size = 29098
max_position_embeddings = {SE}
[parallel]
tp = {TP}
pp = 1
sp = false
[training]
micro_batch_size = {B}
seq_len = {SE}
decoder_seq_len = {SD}
num_microbatches = 2
[framework]
attention_backend = "unfused"
dataloader_batch = "tokens"
transformer_engine = "2.6"
"""


def _run(tmp_path, **edits: str):
    return edited_run(tmp_path, RUN, **edits)


@pytest.fixture(scope="module")
def run(tmp_path_factory):
    return _run(tmp_path_factory.mktemp("t5"))


def _numel(shape: tuple[int, ...]) -> int:
    out = 1
    for n in shape:
        out *= n
    return out


def test_t5_parameters(run):
    """T5Model.__init__: one LanguageModelEmbedding (words [V/tp, h], positions [512, h]); the encoder layer is GPT's
    TE layer and its block's final layernorm; the decoder layer adds pre_cross_attn_layernorm and CrossAttention
    (linear_q [h/tp, h], linear_kv [2h/tp, h], linear_proj [h, h/tp], with biases); the decoder block's final
    layernorm; T5LMHead's output layer on the shared word embedding with its bias [V/tp]."""
    src = AnalyticSource(model=run.model, profile="megatron", framework=run.framework, parallel=run.parallel,
                         training=run.training)
    params = {t.name: t.shape for n in src.nodes(0) for t in n.params}
    gpt_layer = 4 * H + 3 * H * H // TP + 3 * H // TP + H * H // TP + H + 2 * FFN * H // TP + FFN // TP + H
    cross = 2 * H + H * H // TP + H // TP + 2 * H * H // TP + 2 * H // TP + H * H // TP + H
    enc = sum(_numel(v) for k, v in params.items() if k.startswith("layers.0."))
    dec = sum(_numel(v) for k, v in params.items() if k.startswith("layers.1."))
    assert (enc, dec) == (gpt_layer, gpt_layer + cross)
    assert {k: v for k, v in params.items() if not k.startswith("layers.")} == {
        "embedding.word_embeddings.weight": (V_PAD // TP, H), "embedding.position_embeddings.weight": (SE, H),
        "encoder.final_norm.weight": (H,), "encoder.final_norm.bias": (H,), "final_norm.weight": (H,),
        "final_norm.bias": (H,), "output_layer.bias": (V_PAD // TP,)}


def test_cross_attention_saves_its_queries_the_whole_kv_and_the_widened_padding_mask(run):
    """CrossAttention on the decoder's 128 rows over the encoder's 512: the separate pre-cross-attention norm's
    output, mu and rsigma; linear_q's output; linear_kv's output, which the unfused attention's key and value
    views keep whole; TE's fused softmax output [b, np, 128, 512] (a padding mask lets sq differ from sk); the
    widened [b, 1, 128, 512] bool mask masked_fill keeps; attention dropout's mask and output (the product with the
    values keeps it, not masked_fill's output); linear_proj's
    input; the bias-dropout-add mask. The encoder's final-norm output, linear_kv's input, is kept once for every
    decoder layer."""
    saved = {st.tensor.name: st.tensor.size_bytes for st in template_of(run, 0).saved}
    p = "layers.1.cross_attn"
    scores = B * NP * SD * SE
    expected = {"layers.1.pre_cross_attn_layernorm.out": 2 * TD_ROWS * H,
                "layers.1.pre_cross_attn_layernorm.mu": 4 * TD_ROWS,
                "layers.1.pre_cross_attn_layernorm.rsigma": 4 * TD_ROWS,
                f"{p}.linear_q.out": 2 * TD_ROWS * H // TP, f"{p}.linear_kv.out": 2 * TE_ROWS * 2 * H // TP,
                f"{p}.core_attn.softmax": 2 * scores, f"{p}.core_attn.mask.full": B * SD * SE,
                f"{p}.core_attn.dropout.mask": scores,
                f"{p}.core_attn.dropout.out": 2 * scores, f"{p}.core_attn.out": 2 * TD_ROWS * H // TP,
                "layers.1.cross_attn.dropout.mask": TD_ROWS * H, "encoder.final_norm.out": 2 * TE_ROWS * H}
    assert {k: saved.get(k) for k in expected} == expected
    # the decoder's self-attention is causal: no padding mask
    assert not any(k.startswith("layers.1.self_attn.core_attn.mask") for k in saved)
    assert saved["layers.0.self_attn.core_attn.mask.full"] == B * SE * SE  # the encoder's is widened


def test_te_from_1_10_reads_the_bool_masks_and_the_local_spec_stacks_b1ss_masks(tmp_path):
    """pretrain_t5.py get_batch: the six int64 keys in one flat buffer, the fp32 loss mask; under TE ≥ 1.10 the two
    bool masks ([b, s]); under the local implementation _build_b1ss_attention_mask's three stacked bool masks
    (the encoder's [b, 1, 512, 512], the decoder's [b, 1, 128, 128], the cross mask [b, 1, 128, 512])."""
    def made(run) -> dict[str, int]:
        return {t.name: t.size_bytes for op in forward_ops_of(run, 0) if op.name.startswith("batch.")
                for t in op.outputs.values() if ".sample" not in t.name}

    flat = 8 * B * (2 * SE + 4 * SD)
    assert made(_run(tmp_path)) == {"batch.t5_flat": flat, "batch.loss_mask_fp32": 4 * B * SD,
                                    "batch.enc_mask": B * SE, "batch.dec_mask": B * SD}
    local = _run(tmp_path, attention_backend='"local"\ntransformer_impl = "local"')
    assert made(local) == {"batch.t5_flat": flat, "batch.loss_mask_fp32": 4 * B * SD,
                           "batch.enc_b1ss": B * SE * SE, "batch.enc_dec_b1ss": B * SD * SE,
                           "batch.dec_b1ss": B * SD * SD}


@pytest.mark.parametrize(("edit", "key"), [
    ({"pp": "2"}, "parallel.pp"),
    ({"attention_backend": '"flash"'}, "framework.attention_backend"),
    ({"decoder_seq_len": "0"}, "training.decoder_seq_len"),
    ({"encoder_layers": "2"}, "model.encoder_layers"),
])
def test_what_t5_is_not_modelled_with_is_one_line_naming_the_key(tmp_path, edit, key):
    with pytest.raises(UserError) as exc:
        _run(tmp_path, **edit)
    assert key in str(exc.value) and "\n" not in str(exc.value).strip().splitlines()[-1]
