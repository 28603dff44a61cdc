"""from-megatron's reader and mapping: both input formats, Megatron's defaults, $VAR handling,
--moe-layer-freq without eval, the layout arguments, environment variables, refusals by name."""

from __future__ import annotations

import pytest

from timeline.errors import UserError
from timeline.io.megatron_args import from_mapping, parse_arg_list
from timeline.io.megatron_layout import moe_layer_pattern, parse_layout, split_layers
from timeline.io.megatron_write import UnschedulableJob, convert

BASE = {"--num-layers": 4, "--hidden-size": 256, "--num-attention-heads": 8, "--seq-length": 512,
        "--micro-batch-size": 2, "--global-batch-size": 16, "--bf16": True}


def sections(args: dict, env: dict | None = None, world_size: int = 2, **kw) -> dict:
    return convert(from_mapping(args, env), world_size=world_size, **kw).sections


def test_defaults_are_megatrons_command_line():
    s = sections(BASE)
    m, f = s["model"], s["framework"]
    assert (m["norm"], m["hidden_act"], m["position_embedding"]) == ("layernorm", "gelu", "learned")
    assert m["linear_bias"] and m["tie_word_embeddings"] and m["intermediate_size"] == 1024
    assert m["hidden_dropout"] == m["attention_dropout"] == 0.1 and m["vocab_size"] == 50257
    assert f["gradient_accumulation_fusion"] and f["transformer_impl"] == "transformer_engine"
    assert f["attention_backend"] == "fused"  # TE auto on sm90 prefers cuDNN fused attention
    assert s["parallel"]["dp"] == 2 and s["training"]["num_microbatches"] == 4
    assert s["parallel"]["sp"] is False and s["training"]["zero"] == 0


def test_yaml_keys_without_dashes_and_false_flags():
    args = {k.removeprefix("--"): v for k, v in BASE.items()} | {"swiglu": True, "untie-embeddings-and-output-weights": False}
    m = sections(args)["model"]
    assert m["hidden_act"] == "silu" and m["intermediate_size"] == int((4 * 256 * 2 / 3) / 64) * 64
    assert m["tie_word_embeddings"]


def test_argument_list_with_continuations_and_comments():
    text = ("# launch\nCUDA_DEVICE_MAX_CONNECTIONS=1 torchrun pretrain_gpt.py \\\n"
            "  --num-layers 4 --hidden-size 256 \\\n  --num-attention-heads 8  # heads\n"
            "  --seq-length 512 --micro-batch-size 2 --global-batch-size=16 --bf16 --data-path 0.5 a 0.5 b\n")
    margs = parse_arg_list(text)
    assert margs.args["--global-batch-size"] == "16" and margs.args["--bf16"] is True
    assert margs.args["--data-path"] == ("0.5", "a", "0.5", "b") and margs.family == "gpt"
    assert convert(margs, world_size=1).sections["training"]["num_microbatches"] == 8


def test_unexpanded_variable_in_a_memory_argument_is_an_error_naming_it():
    with pytest.raises(UserError, match="--hidden-size"):
        sections(BASE | {"--hidden-size": "${HIDDEN}"})
    sections(BASE | {"--save": "${CHECKPOINT_SAVE_PATH}", "--data-path": "$DATA_BLEND"})  # neutral: ignored


@pytest.mark.parametrize("arg,needle", [("--fp4-format", "--fp4-format"), ("--frobnicate", "--frobnicate"),
                                        ("--encoder-num-layers", "T5")])
def test_refused_arguments_name_themselves(arg, needle):
    with pytest.raises(UserError, match=needle):
        sections(BASE | {arg: "hybrid"})


def test_moe_layer_freq_is_parsed_without_eval():
    assert moe_layer_pattern("([0]*1+[1]*3)", 4) == [0, 1, 1, 1]
    assert moe_layer_pattern(2, 4) == [1, 0, 1, 0]
    with pytest.raises(UserError, match="--moe-layer-freq"):
        moe_layer_pattern("__import__('os').system('true')", 4)
    m = sections(BASE | {"--num-experts": 4, "--moe-layer-freq": "([0]*1+[1]*3)"})["model"]
    assert (m["first_k_dense_replace"], m["moe_layer_freq"]) == (1, 1) and "mlp_layer_types" not in m
    # a list no first-k / every-n rule gives is written layer by layer (a dense last layer: Chimera's 12B MoE)
    m = sections(BASE | {"--num-experts": 4, "--moe-layer-freq": "[0,1,1,0]"})["model"]
    assert m["mlp_layer_types"] == ("dense", "moe", "moe", "dense") and "first_k_dense_replace" not in m


def test_layout_arguments():
    assert parse_layout("Et*3|t*3|t*3|t*2L", 2) == ([3, 3, 3, 2], 2)
    assert split_layers(14, 4, first=None, last=None, embedding=True, loss=True) == [3, 4, 4, 3]
    assert split_layers(10, 3, first=2, last=2, embedding=False, loss=False) == [2, 6, 2]
    assert split_layers(12, 6, first=2, last=2, embedding=False, loss=False, pp=3) == [1, 4, 1, 1, 4, 1]
    p = sections(BASE | {"--num-layers": 8, "--pipeline-model-parallel-size": 2,
                         "--num-layers-per-virtual-pipeline-stage": 2}, world_size=2)
    assert p["parallel"]["vpp"] == 2 and p["schedule"]["kind"] == "interleaved"


def test_world_size_must_divide():
    with pytest.raises(UserError, match="tp·pp·cp"):
        sections(BASE | {"--tensor-model-parallel-size": 4}, world_size=6)


def test_a_world_size_megatron_s_schedule_refuses_is_refused_naming_the_arguments():
    """8 layers on pp 2 × 2 chunks: 16 samples at micro-batch 2 on 4 GPUs (dp 2) is 4 micro-batches, two
    full groups of pp; on 2 GPUs (dp 1) 8, also whole; 12 samples on 2 GPUs is 6 (3 groups); but on 4 GPUs
    12 samples are 3 micro-batches, a last group of 1 < pp, which Megatron's interleaved schedule refuses."""
    args = BASE | {"--num-layers": 8, "--pipeline-model-parallel-size": 2,
                   "--num-layers-per-virtual-pipeline-stage": 2}
    assert sections(args, world_size=4)["training"]["num_microbatches"] == 4
    assert sections(args | {"--global-batch-size": 12}, world_size=2)["training"]["num_microbatches"] == 6
    with pytest.raises(UnschedulableJob, match=r"--world-size 4: data-parallel size 2 gives 3 micro-batches "
                       r"\(global batch 12 / \(micro-batch 2 · dp 2\)\)") as exc:
        sections(args | {"--global-batch-size": 12}, world_size=4)
    assert "\n" not in str(exc.value) and isinstance(exc.value, UserError)


def test_environment_is_honoured():
    s = sections(BASE, {"PYTORCH_CUDA_ALLOC_CONF": "expandable_segments:True", "NVTE_FUSED_ATTN": "0",
                        "NVTE_FLASH_ATTN": "0", "CUBLAS_WORKSPACE_CONFIG": ":4096:8", "NCCL_BUFFSIZE": "4194304"})
    assert s["allocator"]["expandable_segments"] is True
    assert s["framework"]["attention_backend"] == "unfused"
    assert s["framework"]["cublas_workspace_config"] == ":4096:8"
    assert sections(BASE, {"NVTE_FUSED_ATTN": "0"}, gpu="a100")["framework"]["attention_backend"] == "flash"


def test_auto_attention_follows_te_s_backend_choice():
    """TE 2.6 get_attention_backend: cuDNN fused attention is preferred on sm ≥ 90; in deterministic
    training its F16 sub-backend needs sm ≥ 90, so Ampere runs flash attention there too."""
    det = {"NVTE_ALLOW_NONDETERMINISTIC_ALGO": "0"}
    assert sections(BASE, det, gpu="a100")["framework"]["attention_backend"] == "flash"
    assert sections(BASE, det, gpu="h100")["framework"]["attention_backend"] == "fused"
    assert sections(BASE, {}, gpu="a100")["framework"]["attention_backend"] == "flash"  # flash first below sm90
    assert sections(BASE, det | {"NVTE_FLASH_ATTN": "0"}, gpu="a100")["framework"]["attention_backend"] == "unfused"


def test_te_before_1_3_turns_flash_attention_off_in_deterministic_training():
    """TE v1.2.1 DotProductAttention.__init__ disables FlashAttention 2 whenever
    NVTE_ALLOW_NONDETERMINISTIC_ALGO=0; with the F16 fused backend also off for determinism below sm90, an
    A100 runs TE's unfused attention (from v1.3 flash-attn ≥ 2.4.1 stays on)."""
    det = {"NVTE_ALLOW_NONDETERMINISTIC_ALGO": "0"}
    assert sections(BASE, det, gpu="a100", te_version="1.2")["framework"]["attention_backend"] == "unfused"
    assert sections(BASE, det, gpu="a100", te_version="1.3")["framework"]["attention_backend"] == "flash"
    assert sections(BASE, {}, gpu="a100", te_version="1.2")["framework"]["attention_backend"] == "flash"
    assert sections(BASE, det, gpu="h100", te_version="1.2")["framework"]["attention_backend"] == "fused"


def test_auto_attention_on_blackwell_in_deterministic_training_follows_the_te_version():
    """TE's "Disabling FusedAttention for determinism reasons on Blackwell": none before 2.7, always in
    2.9–2.11, and from 2.12 (fused_attn.cpp) only with dropout; flash attention is what remains."""
    det = {"NVTE_ALLOW_NONDETERMINISTIC_ALGO": "0"}

    def backend(te: str, args: dict = BASE, env: dict = det) -> str:
        return sections(args, env, gpu="gb200", te_version=te)["framework"]["attention_backend"]

    assert backend("2.6") == "fused"
    assert backend("2.10") == "flash" and backend("2.14") == "flash"  # attention dropout 0.1 by default
    assert backend("2.14", BASE | {"--attention-dropout": 0.0}) == "fused"
    assert backend("2.11", BASE | {"--attention-dropout": 0.0}) == "flash"
    assert backend("2.14", env={}) == "fused"  # non-deterministic training keeps the fused backend
    assert sections(BASE, det, gpu="h100", te_version="2.14")["framework"]["attention_backend"] == "fused"


def test_auto_attention_keeps_flash_attention_to_its_head_dims():
    """TE's "Filter: Head dimension": FlashAttention 2 runs neither MLA nor head dims over 256, so
    deterministic Ampere falls back to unfused attention there."""
    det = {"NVTE_ALLOW_NONDETERMINISTIC_ALGO": "0"}
    mla = BASE | {"--multi-latent-attention": True}
    assert sections(mla, det, gpu="a100")["framework"]["attention_backend"] == "unfused"
    assert sections(mla, det, gpu="h100")["framework"]["attention_backend"] == "fused"
    wide = BASE | {"--kv-channels": 320}
    assert sections(wide, det, gpu="a100")["framework"]["attention_backend"] == "unfused"
    assert sections(BASE | {"--kv-channels": 128}, det, gpu="a100")["framework"]["attention_backend"] == "flash"


def test_the_dataloader_batch_follows_create_attention_mask():
    assert sections(BASE)["framework"]["dataloader_batch"] == "mask"  # Megatron's default creates it
    no_mask = BASE | {"--no-create-attention-mask-in-dataloader": True}
    assert sections(no_mask)["framework"]["dataloader_batch"] == "tokens"


def test_fp16_keeps_fp16_grads_unless_accumulated_in_fp32():
    args = {k: v for k, v in BASE.items() if k != "--bf16"} | {"--fp16": True}
    assert sections(args)["training"]["grad_dtype"] == "fp16"
    assert sections(args | {"--accumulate-allreduce-grads-in-fp32": True})["training"]["grad_dtype"] == "fp32"


MOE = BASE | {"--num-experts": 8, "--moe-router-topk": 2, "--expert-model-parallel-size": 2}


@pytest.mark.parametrize(("extra", "want"), [
    ({}, "none"),  # Megatron's default: aux_loss with --moe-aux-loss-coeff 0.0 computes no loss
    ({"--moe-aux-loss-coeff": 1e-2}, "aux_loss"),
    ({"--moe-aux-loss-coeff": "1e-4", "--moe-router-load-balancing-type": "seq_aux_loss"}, "seq_aux_loss"),
    ({"--moe-aux-loss-coeff": [0.0, 1e-3], "--moe-router-load-balancing-type": "global_aux_loss"},
     "global_aux_loss"),
    ({"--moe-aux-loss-coeff": 1e-2, "--moe-router-load-balancing-type": "sinkhorn"}, "sinkhorn"),
])
def test_the_aux_loss_type_is_written_only_where_its_loss_is_computed(extra: dict, want: str) -> None:
    assert sections(MOE | extra)["framework"]["moe_router_load_balancing"] == want


def test_router_loss_arguments_name_themselves() -> None:
    # TopKRouter.apply_z_loss runs whenever the coefficient is given, 0 included
    assert sections(MOE | {"--moe-z-loss-coeff": 0})["framework"]["moe_z_loss"] is True
    assert sections(MOE | {"--moe-z-loss-coeff": 1e-3})["framework"]["moe_z_loss"] is True
    assert sections(MOE)["framework"]["moe_z_loss"] is False
    with pytest.raises(UserError, match="--moe-aux-loss-coeff: expected numbers >= 0"):
        sections(MOE | {"--moe-aux-loss-coeff": -1})
    dense = sections(BASE | {"--moe-z-loss-coeff": 1e-3, "--moe-aux-loss-coeff": 1e-2})  # no router: neutral
    assert "moe_router_load_balancing" not in dense["framework"]


def test_the_grad_buffer_s_bucketing_arguments():
    f = sections(BASE)["framework"]
    assert (f["overlap_grad_reduce"], f["ddp_bucket_size"], f["ddp_pad_for_busbw"]) == (False, 0, False)
    f = sections(BASE | {"--overlap-grad-reduce": True, "--ddp-bucket-size": 1_000_000,
                         "--ddp-pad-buckets-for-high-nccl-busbw": True})["framework"]
    assert (f["overlap_grad_reduce"], f["ddp_bucket_size"], f["ddp_pad_for_busbw"]) == (True, 1_000_000, True)
    with pytest.raises(UserError, match="--ddp-bucket-size"):
        sections(BASE | {"--ddp-bucket-size": -5})


@pytest.mark.parametrize("value", ["[layernorm mlp moe_act]", "layernorm mlp moe_act", ["layernorm", "mlp", "moe_act"]])
def test_recompute_modules_as_yaml_strings_or_lists(value):
    # functional-test YAMLs write "[a b c]"; the launcher word-splits it and argparse (nargs="*") gets the names
    s = sections(BASE | {"--recompute-granularity": "selective", "--recompute-modules": value})
    assert s["recompute"]["modules"] == ["layernorm", "mlp", "moe_act"]


def test_gpt_oss_knobs_map_to_the_model():
    """Megatron-Core's GPT-OSS arguments (core_v0.15.0 on): a learned sink per head, a causal window on the layers
    --window-attn-skip-freq leaves sliding (1-based: every 2nd layer full), the quick-GEGLU gated unit with its
    offset and clamp."""
    args = BASE | {"--num-experts": 4, "--moe-router-topk": 2, "--softmax-type": "learnable", "--window-size": "127,0",
                   "--window-attn-skip-freq": 2, "--quick-geglu": True, "--glu-linear-offset": 1.0,
                   "--activation-func-clamp-value": 7.0}
    m = sections(args, world_size=2)["model"]
    assert (m["attention_sinks"], m["sliding_window"], m["hidden_act"]) == (True, 128, "silu")
    assert (m["swiglu_alpha"], m["glu_linear_offset"], m["swiglu_limit"]) == (1.702, 1.0, 7.0)
    assert m["layer_types"] == ["sliding_attention", "full_attention"] * 2
    pattern = sections(args | {"--window-attn-skip-freq": "[1,1,0,1]"}, world_size=2)["model"]["layer_types"]
    assert pattern == ["sliding_attention", "sliding_attention", "full_attention", "sliding_attention"]
    every = sections({k: v for k, v in args.items() if k != "--window-attn-skip-freq"},
                     world_size=2)["model"]["layer_types"]
    assert every == ["sliding_attention"] * 4


def test_off_by_one_softmax_is_a_fixed_sink():
    m = sections(BASE | {"--softmax-type": "off-by-one"})["model"]
    assert (m["attention_sinks"], m["sink_fixed"]) == (True, True)
    assert "sink_fixed" not in sections(BASE | {"--softmax-type": "learnable"})["model"]


@pytest.mark.parametrize(("extra", "needle"), [({"--window-size": "127,8"}, "only a causal window"),
                                               ({"--window-size": "7", "--window-attn-skip-freq": 2},
                                                "expected two integers")])
def test_gpt_oss_knobs_out_of_the_model_are_refused(extra, needle):
    with pytest.raises(UserError) as err:
        sections(BASE | extra)
    assert needle in str(err.value)


def test_empty_unused_memory_level_is_mapped():
    assert "empty_unused_memory_level" not in sections(BASE)["framework"]  # 0: Megatron's default, not written
    assert sections(BASE | {"--empty-unused-memory-level": 2})["framework"]["empty_unused_memory_level"] == 2
    with pytest.raises(UserError) as err:
        sections(BASE | {"--empty-unused-memory-level": 3})
    assert "0, 1 and 2" in str(err.value)
