"""``megatron`` profile on Megatron-Core's LLaVA as ``pretrain_vlm.py`` builds it (``graph/families/llava.py``): the
shape of Megatron-LM's ``multimodal_llava_mcore_te_tp1_pp1`` functional test (hidden 624, 12 heads of 52, GeLU MLP
2496, LayerNorm, biases, learned positions, micro-batch 4 × 1,024 text tokens and one 336 × 336 image of 14-pixel
patches, dropout 0), one ViT and one decoder layer, TE's unfused attention (52 is no head dimension flash or cuDNN
takes). Parameters and saved tensors are the sums of the shapes the cited sources give, to the byte."""

from __future__ import annotations

import math

import pytest
from helpers_run import edited_run
from sources import forward_ops_of, template_of

from timeline.errors import UserError
from timeline.graph.analytic import AnalyticSource

B, TEXT, H, HEADS, FFN, V_PAD = 4, 1024, 624, 12, 2496, 8320
IMG, PATCH = 336, 14
GRID = (IMG // PATCH) ** 2  # 576 patches
NV = GRID + 1  # the ViT's tokens: the class token and the patches
S = TEXT + NV  # the decoder's positions: the text, the image's embeddings in place of its token
RUN = f"""[model]
preset = "megatron-gpt"
architecture = "llava"
num_layers = 1
vision_layers = 1
hidden_size = {H}
num_attention_heads = {HEADS}
intermediate_size = {FFN}
hidden_act = "gelu"
norm = "layernorm"
position_embedding = "learned"
linear_bias = true
tie_word_embeddings = false
hidden_dropout = 0.0
attention_dropout = 0.0
vocab_size = 8193
max_position_embeddings = {S}
image_height = {IMG}
image_width = {IMG}
patch_size = {PATCH}
frozen = []
[parallel]
tp = 1
pp = 1
cp = 1
sp = false
[recompute]
policy = "none"
[training]
micro_batch_size = {B}
seq_len = {S}
num_microbatches = 2
[framework]
attention_backend = "unfused"
transformer_engine = "2.6"
"""


def _run(tmp_path, **edits: str):
    return edited_run(tmp_path, RUN, **edits)


@pytest.fixture(scope="module")
def run(tmp_path_factory):
    return _run(tmp_path_factory.mktemp("llava"))


def test_llava_parameters(run):
    """LLaVAModel on one stage: the ViT (CLIPViTModel: conv1 [h, 3, 14, 14] without bias, the class token [1, 1, h],
    its position table [577, h], ln_pre) and its layer, GPT's TE layer; the projector (MLP of the decoder spec's
    submodules: fc1's fused LayerNorm, fc1 [2496, h] and fc2 [h, 2496] with biases); the language model (words
    [V, h], positions [S, h]: language_max_sequence_length, its layer, the final norm, an untied output layer)."""
    src = AnalyticSource(model=run.model, profile="megatron", framework=run.framework, parallel=run.parallel,
                         training=run.training)
    params = {t.name: t.shape for n in src.nodes(0) for t in n.params}
    layer = 4 * H + 3 * H * H + 3 * H + H * H + H + 2 * FFN * H + FFN + H
    vit = sum(math.prod(v) for k, v in params.items() if k.startswith("vision_model.layers.0."))
    lm = sum(math.prod(v) for k, v in params.items() if k.startswith("layers.0."))
    assert (vit, lm) == (layer, layer)
    rest = {k: v for k, v in params.items() if ".layers." not in k and not k.startswith("layers.")}
    assert rest == {
        "vision_model.conv1.weight": (H, 3, PATCH, PATCH), "vision_model.class_token": (1, 1, H),
        "vision_model.position_embeddings.weight": (NV, H), "vision_model.ln_pre.weight": (H,),
        "vision_model.ln_pre.bias": (H,), "vision_projection.norm.weight": (H,), "vision_projection.norm.bias": (H,),
        "vision_projection.mlp.fc1.weight": (FFN, H), "vision_projection.mlp.fc2.weight": (H, FFN),
        "vision_projection.mlp.fc1.bias": (FFN,), "vision_projection.mlp.fc2.bias": (H,),
        "embedding.word_embeddings.weight": (V_PAD, H), "embedding.position_embeddings.weight": (S, H),
        "final_norm.weight": (H,), "final_norm.bias": (H,), "output_layer.weight": (V_PAD, H)}


def test_te_s_torch_softmax_keeps_fp32_probabilities_and_their_bf16_cast(run):
    """TE's UnfusedDotProductAttention where its fused softmax kernel does not take the shape (577 and 1,601 keys
    are no multiples of 8): FusedScaleMaskSoftmax.forward_torch_softmax (softmax_in_fp32 by default) keeps torch's
    fp32 softmax, the bf16 cast feeds the product with V, which keeps it; the ViT's layer has no mask (plain
    softmax), the decoder's the causal one applied in place (its backward's second fp32 gradient: scratch)."""
    saved = {st.tensor.name: st.tensor.size_bytes for st in template_of(run, 0).saved}
    for prefix, n in (("vision_model.layers.0", NV), ("layers.0", S)):
        scores = B * HEADS * n * n
        assert (saved[f"{prefix}.self_attn.core_attn.softmax"], saved[f"{prefix}.self_attn.core_attn.softmax_cast"]) \
            == (4 * scores, 2 * scores), prefix
        assert f"{prefix}.self_attn.core_attn.scores" not in saved
        assert f"{prefix}.self_attn.core_attn.softmax_in" not in saved
    rules = {op.name: op.rule for op in forward_ops_of(run, 0) if op.name.endswith("core_attn.softmax_op")}
    assert rules == {"vision_model.layers.0.self_attn.core_attn.softmax_op": "softmax",
                     "layers.0.self_attn.core_attn.softmax_op": "te_torch_softmax_masked"}


def test_the_first_stage_keeps_the_image_its_vit_and_projector_save_and_the_decoder_s_input(run):
    """Float16Module's bf16 copy of the images (conv1 keeps it), the class-token concatenation's position sum
    (ln_pre keeps it), the projector's fused norm input, its fc1 output (GeLU) and fc2 input, and the decoder's
    input: `final_embedding.transpose(1, 0).contiguous()` of [S, b, h]."""
    saved = {st.tensor.name: st.tensor.size_bytes for st in template_of(run, 0).saved}
    rows = B * NV
    expected = {"batch.images_bf16": 2 * B * 3 * IMG * IMG, "vision_model.position_add.out": 2 * rows * H,
                "llava.image_embeddings": 2 * rows * H, "vision_projection.norm.out": 2 * rows * H,
                "vision_projection.mlp.linear_fc1.out": 2 * rows * FFN,
                "vision_projection.mlp.act.out": 2 * rows * FFN, "llava.decoder_input": 2 * B * S * H}
    assert {k: saved.get(k) for k in expected} == expected


def test_the_batch_is_pretrain_vlm_s_two_broadcast_buffers(run):
    """get_batch: tokens, position ids and labels (int64 [b, 1025]: the text and the image token) as one buffer;
    the image (fp32 [b, 3, 336, 336]) and the loss mask (fp32 [b, 1025]) as another; the final labels and loss
    mask [b, S] (int64, bf16 — Float16Module converted the loss mask — and its fp32 copy for the loss)."""
    made = {t.name: t.size_bytes for op in forward_ops_of(run, 0)
            if op.name.startswith(("batch.", "llava.final_labels")) for t in op.outputs.values()}
    t = TEXT + 1
    assert made == {"batch.vlm_int64": 8 * 3 * B * t, "batch.vlm_fp32": 4 * (B * 3 * IMG * IMG + B * t),
                    "batch.images_bf16": 2 * B * 3 * IMG * IMG, "batch.loss_mask_bf16": 2 * B * t,
                    "llava.final_labels": 8 * B * S, "llava.final_loss_mask": 2 * B * S,
                    "llava.final_loss_mask_fp32": 4 * B * S}


def test_pipeline_stages_hold_the_vit_on_the_first_and_the_labels_on_the_last(tmp_path):
    """model_provider: the ViT and projector on the first pipeline stage only (add_encoder); the last stage's
    _preprocess_data makes the final labels and the fp32 loss mask (no Float16Module conversion there)."""
    run = _run(tmp_path, num_layers="2", pp="2")
    first = {op.name for op in forward_ops_of(run, 0)}
    last = {op.name: op for op in forward_ops_of(run, 1)}
    assert "vision_model.conv1" in first and not any(n.startswith("vision_") for n in last)
    assert {t.name: t.dtype for t in last["llava.final_labels"].outputs.values()} == {
        "llava.final_labels": "int64", "llava.final_loss_mask": "fp32"}


@pytest.mark.parametrize(("edit", "key"), [
    ({"vision_layers": "0"}, "model.vision_layers"),
    ({"image_height": "330"}, "model.image_height"),
    ({"sp": "true", "tp": "2"}, "parallel.sp"),
    ({"cp": "2"}, "parallel.cp"),
    ({"seq_len": "512"}, "training.seq_len"),
    ({"policy": '"full"\nnum_layers = 1'}, "recompute.policy"),
])
def test_what_llava_is_not_modelled_with_is_one_line_naming_the_key(tmp_path, edit, key):
    with pytest.raises(UserError) as exc:
        _run(tmp_path, **edit)
    assert key in str(exc.value)


def test_vision_fields_outside_llava_are_refused(tmp_path):
    with pytest.raises(UserError, match="model.vision_layers"):
        _run(tmp_path, architecture='"gpt"')


def test_a_vit_stage_of_its_own_sends_the_image_embeddings_to_the_first_decoder_stage(tmp_path):
    """--encoder-pipeline-model-parallel-size 1 (``parallel.encoder_pp``): the first stage runs the ViT and the
    projector and sends the [577·b, h] image embeddings (LLaVAModel returns them without a decoder); the next stage
    receives them, holds the embedding and combines; Float16Module converts only on the first pipeline stage, so the
    final loss mask stays fp32 there."""
    run = _run(tmp_path, pp="2\nencoder_pp = 1\nlayout = [0, 1]")
    vit = {op.name: op for op in forward_ops_of(run, 0)}
    dec = {op.name: op for op in forward_ops_of(run, 1)}
    assert "vision_model.conv1" in vit and "embedding" not in vit and not any(n.startswith("layers.") for n in vit)
    assert vit["send_forward"].inputs["x"].shape == (B * NV, H)
    assert dec["recv_forward"].outputs["y"].shape == (B * NV, H)
    assert "embedding" in dec and not any(n.startswith("vision_") for n in dec)
    assert dec["llava.final_labels"].outputs["loss_mask"].dtype == "fp32"
    src = AnalyticSource(model=run.model, profile="megatron", framework=run.framework, parallel=run.parallel,
                         training=run.training)
    assert [n.name for n in src.nodes(0)][-1] == "vision_projection"
    assert [n.name for n in src.nodes(1)][0] == "embedding"


def test_frozen_modules_keep_no_weight_gradient_inputs_and_a_frozen_vit_no_autograd_record(tmp_path):
    """--freeze-ViT: the images take no gradient and the ViT's weights none, so autograd records nothing of it (no
    tensor kept, no backward op), and the projector's input takes no gradient; --freeze-LM: the decoder's TE linears
    keep no input (``_Linear`` / ``_LayerNormLinear`` save it only ``if weight.requires_grad``), the norms, GeLU and
    attention keep theirs for the input gradient the projector needs; the frozen embedding of the text records
    nothing. Frozen weights have no gradient or optimizer state."""
    def saved_of(run) -> dict[str, int]:
        return {st.tensor.name: st.tensor.size_bytes for st in template_of(run, 0).saved}

    base = saved_of(_run(tmp_path))
    vit = _run(tmp_path, frozen='["vision"]')
    tpl = template_of(vit, 0)
    frozen_vit = {st.tensor.name for st in tpl.saved}
    assert not any(n.startswith(("vision_model.", "batch.images")) for n in frozen_vit)
    assert not any(op.name.startswith("vision_model.") for op in tpl.backward)
    assert not any(t.name == "grad:llava.image_embeddings" for op in tpl.backward for t in op.allocs)
    assert "vision_projection.mlp.linear_fc1.out" in frozen_vit  # the trainable projector keeps its own
    lm = saved_of(_run(tmp_path, frozen='["language"]'))
    rows = B * S
    wgrad_only = {"layers.0.input_layernorm.out": 2 * rows * H, "layers.0.self_attn.core_attn.out": 2 * rows * H,
                  "layers.0.post_attention_layernorm.out": 2 * rows * H, "layers.0.mlp.act.out": 2 * rows * FFN,
                  "final_norm.out": 2 * rows * H}
    assert {k: base.get(k) for k in wgrad_only} == wgrad_only
    assert not set(wgrad_only) & set(lm)
    assert {k: v for k, v in base.items() if k not in wgrad_only and not k.startswith("embedding")} == \
        {k: v for k, v in lm.items() if not k.startswith("embedding")}
    src = AnalyticSource(model=vit.model, profile="megatron", framework=vit.framework, parallel=vit.parallel,
                         training=vit.training)
    trainable = {t.name for n in src.nodes(0) for t in n.params if t.trainable}
    assert trainable and not any(n.startswith("vision_model.") for n in trainable)
    assert any(n.startswith("vision_projection.") for n in trainable)


def test_te_before_1_6_keeps_a_frozen_layernorm_linear_s_norm_output(tmp_path):
    """TE's _LayerNormLinear keeps its norm output whatever the weight before v1.6 (580eb52b3, "Do not store input
    activations when not computing weight gradients"); its plain _Linear never kept a frozen weight's input."""
    def saved_of(te: str) -> set[str]:
        run = _run(tmp_path, frozen='["language"]', transformer_engine=f'"{te}"')
        return {st.tensor.name for st in template_of(run, 0).saved}

    old, new = saved_of("1.5"), saved_of("1.6")
    assert old - new == {"layers.0.input_layernorm.out", "layers.0.post_attention_layernorm.out"}
    assert not {"layers.0.self_attn.core_attn.out", "layers.0.mlp.act.out"} & old


def test_a_vit_stage_over_fewer_ranks_is_split_by_its_own_tensor_parallelism(tmp_path):
    """--encoder-tensor-model-parallel-size under an encoder stage: the ViT and projector's weights and heads are
    split over encoder_tp ranks (pretrain_vlm.py's vision configs), the decoder's over tp."""
    run = _run(tmp_path, tp="2", pp="2\nencoder_pp = 1\nencoder_tp = 1\nlayout = [0, 1]", num_layers="1")
    src = AnalyticSource(model=run.model, profile="megatron", framework=run.framework, parallel=run.parallel,
                         training=run.training)
    vit = {t.name: t.shape for n in src.nodes(0) for t in n.params}
    dec = {t.name: t.shape for n in src.nodes(1) for t in n.params}
    assert vit["vision_model.layers.0.mlp.fc1.weight"] == (FFN, H)
    assert vit["vision_projection.mlp.fc1.weight"] == (FFN, H)
    assert dec["layers.0.mlp.fc1.weight"] == (FFN // 2, H)
    scores = {t.name: t.shape for op in forward_ops_of(run, 0) for t in op.outputs.values() if t.name.endswith("scores")}
    assert scores == {"vision_model.layers.0.self_attn.core_attn.scores": (B, HEADS, NV, NV)}


def test_the_vit_has_no_rotary_embedding_whatever_the_decoder_s(tmp_path):
    """CLIPViTModel.forward adds its learned position table and calls its TransformerBlock without rotary
    embeddings; the decoder under --position-embedding-type rope rotates its q and k."""
    run = _run(tmp_path, position_embedding='"rope"')
    ropes = [op.name for op in forward_ops_of(run, 0) if op.rule == "rope"]
    assert ropes == ["layers.0.self_attn.rope"]


def test_a_frozen_vit_is_not_recomputed(tmp_path):
    """Selective recompute reaches the ViT's layers (their config is the decoder's copy); frozen, their checkpoint's
    output takes no gradient, so its backward, and the recompute, never run."""
    run = _run(tmp_path, frozen='["vision"]', policy='"selective"\nmodules = ["core_attn"]')
    recomputed = {op.name for op in template_of(run, 0).backward if op.recompute}
    assert recomputed and not any(n.startswith("vision_model.") for n in recomputed)
    plain = _run(tmp_path, policy='"selective"\nmodules = ["core_attn"]')
    assert any(op.name.startswith("vision_model.") for op in template_of(plain, 0).backward if op.recompute)
