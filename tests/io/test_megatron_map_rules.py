"""The arguments from-megatron maps since every parser argument was classified: deprecated spellings
of mapped switches, batch schedules, the unpadded vocabulary, and the arguments refused only at some
values (a CP exchange other than p2p, a non-default value, a view that needs SP to matter)."""

from __future__ import annotations

import re
import tomllib

import pytest

from timeline.errors import UserError
from timeline.io.megatron_args import from_mapping
from timeline.io.megatron_state_args import expert_shard_spread
from timeline.io.megatron_write import convert, run_file_text
from timeline.io.runfile import run_from_data

BASE = {"--num-layers": 4, "--hidden-size": 256, "--num-attention-heads": 8, "--seq-length": 512,
        "--micro-batch-size": 2, "--global-batch-size": 16, "--bf16": True}


def convert_args(args: dict, world_size: int = 2, **kw):
    return convert(from_mapping(args), world_size=world_size, **kw)


def test_recompute_activations_is_selective_core_attn():
    s = convert_args(BASE | {"--recompute-activations": True}).sections
    assert s["recompute"] == {"policy": "selective", "modules": ["core_attn"]}


def test_moe_layer_recompute_appends_moe_to_the_selective_modules():
    moe = {"--num-experts": 4, "--moe-router-topk": 2}
    assert convert_args(BASE | moe | {"--moe-layer-recompute": True}).sections["recompute"]["modules"] == [
        "core_attn", "moe"]
    s = convert_args(BASE | moe | {"--moe-layer-recompute": True, "--recompute-granularity": "selective",
                                   "--recompute-modules": ["mlp", "moe"]}).sections
    assert s["recompute"]["modules"] == ["mlp", "moe"]
    with pytest.raises(UserError, match="--moe-layer-recompute with --recompute-granularity full"):
        convert_args(BASE | moe | {"--moe-layer-recompute": True, "--recompute-granularity": "full"})


def test_batch_schedules_start_where_megatron_starts():
    # dp 2, micro-batch 2: the schedule's first entry (threshold 0) is the measured global batch
    base = {k: v for k, v in BASE.items() if k != "--global-batch-size"}
    s = convert_args(base | {"--step-batch-size-schedule": "0:8 200B:32 400B:64"}).sections
    assert s["training"]["num_microbatches"] == 2
    with pytest.raises(UserError, match="starting at 0:BATCH"):
        convert_args(base | {"--step-batch-size-schedule": "100:8"})
    # Megatron-LM (arguments.py: validate_args) raises where both are given
    with pytest.raises(UserError, match="Cannot specify both --step-batch-size-schedule and --global-batch-size"):
        convert_args(BASE | {"--step-batch-size-schedule": "0:8"})
    # 18 is not a multiple of micro-batch·dp = 4: rounded down to 16 (4 micro-batches)
    s = convert_args(BASE | {"--global-batch-size": 18, "--decrease-batch-size-if-needed": True}).sections
    assert s["training"]["num_microbatches"] == 4
    with pytest.raises(UserError, match="not divisible"):
        convert_args(BASE | {"--global-batch-size": 18})


def test_padded_vocab_size_is_the_vocabulary_unpadded():
    c = convert_args(BASE | {"--padded-vocab-size": 50304, "--tensor-model-parallel-size": 2})
    assert c.sections["model"]["vocab_size"] == 50304
    assert c.sections["framework"]["make_vocab_size_divisible_by"] == 1


def test_cp_comm_types_map_and_allgather_is_refused_only_with_context_parallelism():
    convert_args(BASE | {"--cp-comm-type": "allgather"})  # cp 1: no exchange at all
    cp2 = BASE | {"--context-parallel-size": 2}
    assert convert_args(cp2 | {"--cp-comm-type": ["p2p"]}).sections["framework"]["cp_comm_type"] == ["p2p"]
    assert convert_args(cp2 | {"--cp-comm-type": "a2a"}).sections["framework"]["cp_comm_type"] == ["a2a"]
    per_layer = convert_args(cp2 | {"--cp-comm-type": "p2p a2a p2p a2a"}).sections["framework"]
    assert per_layer["cp_comm_type"] == ["p2p", "a2a", "p2p", "a2a"]
    with pytest.raises(UserError, match=r"^--cp-comm-type allgather: the whole K and V"):
        convert_args(cp2 | {"--cp-comm-type": "allgather"})
    with pytest.raises(UserError, match=r"^--cp-comm-type: 2 values; give one, or one per layer \(4\)"):
        convert_args(cp2 | {"--cp-comm-type": "p2p a2a"})
    # a2a+p2p: arguments.py wants the hierarchical sizes, multiplying to cp; the first is the a2a group
    cp4 = BASE | {"--context-parallel-size": 4, "--cp-comm-type": "a2a+p2p"}
    c = convert_args(cp4 | {"--hierarchical-context-parallel-sizes": "2 2"}, world_size=4)
    assert (c.sections["framework"]["cp_comm_type"], c.sections["framework"]["cp_a2a_size"]) == (["a2a+p2p"], 2)
    for sizes in (None, "2 4"):
        with pytest.raises(UserError, match=r"^--hierarchical-context-parallel-sizes"):
            convert_args(cp4 | ({"--hierarchical-context-parallel-sizes": sizes} if sizes else {}), world_size=4)


def test_p2p_overlap_matters_only_to_the_interleaved_schedule():
    pp = {"--pipeline-model-parallel-size": 2, "--no-overlap-p2p-communication": True}
    convert_args(BASE | pp, world_size=4)
    # arguments.py: validate_args wants pp > 2 for an interleaved schedule without p2p overlap
    with pytest.raises(UserError, match="^2 virtual pipeline stages per rank with --pipeline-model-parallel-size 2: "
                                        "Megatron-LM refuses an interleaved schedule with pp < 3 without p2p overlap"):
        convert_args(BASE | pp | {"--num-layers-per-virtual-pipeline-stage": 1}, world_size=4)
    pp4 = BASE | {"--num-layers": 8, "--pipeline-model-parallel-size": 4, "--no-overlap-p2p-communication": True}
    with pytest.raises(UserError, match="--no-overlap-p2p-communication with an interleaved schedule"):
        convert_args(pp4 | {"--num-layers-per-virtual-pipeline-stage": 1}, world_size=4)


def test_an_interleaved_schedule_needs_two_pipeline_ranks_as_megatron_asserts():
    for extra in ({"--num-layers-per-virtual-pipeline-stage": 1}, {"--num-virtual-stages-per-pipeline-rank": 2},
                  {"--pipeline-model-parallel-layout": "Et|t|t|tL"}):
        with pytest.raises(UserError, match=r"^\d virtual pipeline stages per rank with --pipeline-model-parallel-size"
                                            r" 1: Megatron-LM refuses an interleaved schedule with pp < 2 \("):
            convert_args(BASE | extra)
    two = convert_args(BASE | {"--pipeline-model-parallel-size": 2, "--num-layers-per-virtual-pipeline-stage": 1})
    assert (two.sections["parallel"]["vpp"], two.sections["schedule"]["kind"]) == (2, "interleaved")


def test_arguments_refused_only_away_from_their_default():
    convert_args(BASE | {"--cuda-graph-impl": "none", "--mlp-chunks-for-training": 1, "--cpu-offloading-num-layers": 0})
    with pytest.raises(UserError, match=r"^--cuda-graph-impl local: Megatron's own CudaGraphManager"):
        convert_args(BASE | {"--cuda-graph-impl": "local"})
    with pytest.raises(UserError, match=r"^--mlp-chunks-for-training 2: "):
        convert_args(BASE | {"--mlp-chunks-for-training": 2})


def test_views_and_buckets_that_need_another_switch_to_matter():
    convert_args(BASE | {"--no-clone-scatter-output-in-embedding": True})  # no SP
    with pytest.raises(UserError, match="with sequence parallelism"):
        convert_args(BASE | {"--no-clone-scatter-output-in-embedding": True, "--tensor-model-parallel-size": 2,
                             "--sequence-parallel": True})
    convert_args(BASE | {"--ddp-num-buckets": 4})  # without --overlap-grad-reduce: one bucket anyway
    with pytest.raises(UserError, match="give the equivalent --ddp-bucket-size"):
        convert_args(BASE | {"--ddp-num-buckets": 4, "--overlap-grad-reduce": True})


def test_no_position_embedding_only_with_rope():
    convert_args(BASE | {"--no-position-embedding": True, "--position-embedding-type": "rope"})
    with pytest.raises(UserError, match="Megatron-LM rejects it"):
        convert_args(BASE | {"--no-position-embedding": True})


def test_neutral_and_under_a_refused_feature_pass_and_say_why():
    c = convert_args(BASE | {"--fp4-recipe": "nvfp4", "--fp8-margin": 0, "--log-straggler": True,
                             "--kv-lora-rank": 512, "--disable-gloo-process-groups": True})
    assert c.neutral["--fp4-recipe"] == "acts only with --fp4-format (refused)"
    assert c.neutral["--fp8-margin"].startswith("FP8 scaling arithmetic: ")
    assert c.neutral["--log-straggler"].startswith("logging, timers and reporting: ")
    assert c.neutral["--disable-gloo-process-groups"].startswith("process groups, NCCL and launch: ")
    assert c.mapped["--kv-lora-rank"] == "(not used by this configuration)"  # an MLA size, no MLA


def test_jobs_the_config_names_by_mode_or_script():
    with pytest.raises(UserError, match=r"^MODE: inference: an inference job"):
        convert(from_mapping(BASE, mode="inference"), world_size=2)
    convert(from_mapping(BASE, mode="pretraining"), world_size=2)
    with pytest.raises(UserError, match=r"^--num-tokens-to-generate: an inference script's argument"):
        convert_args(BASE | {"--num-tokens-to-generate": 16})
    with pytest.raises(UserError, match=r"^--num-experts-per-tok: not a Megatron-LM argument; use --moe-router-topk"):
        convert_args(BASE | {"--num-experts-per-tok": 2})


EP = {"--num-experts": 4, "--moe-router-topk": 2, "--expert-model-parallel-size": 2,
      "--moe-token-dispatcher-type": "alltoall", "--overlap-moe-expert-parallel-comm": True}


@pytest.mark.parametrize(("version", "releases", "keeps"), [
    ("0.15.0rc8", None, True), ("0.16.0rc0", None, True), ("0.16.0", None, False), ("0.18.0", None, False),
    ("0.16.0rc0", True, False),  # main after a56a0b001d (2026-01-06) still says 0.16.0rc0
])
def test_overlap_moe_expert_parallel_comm_is_combined_1f1b_and_keeps_node_io_before_a56a0b001d(
        version, releases, keeps):
    s = convert_args(BASE | EP, megatron_core=version, releases_nodes=releases).sections
    assert s["schedule"] == {"kind": "1f1b", "combined_1f1b": True}
    assert s["framework"]["combined_1f1b_keeps_node_io"] is keeps
    assert s["framework"]["ep_overlap_early_attn_memory_release"] is False


def test_combined_1f1b_is_refused_where_megatron_refuses_it():
    with pytest.raises(UserError, match="--overlap-moe-expert-parallel-comm: .*virtual pipeline"):
        convert_args(BASE | EP | {"--pipeline-model-parallel-size": 2}, world_size=4)
    with pytest.raises(UserError, match="alltoall or flex"):
        convert_args(BASE | EP | {"--moe-token-dispatcher-type": "allgather"})
    with pytest.raises(UserError, match="--ep-overlap-early-attn-memory-release: .*0.16.0"):
        convert_args(BASE | EP | {"--ep-overlap-early-attn-memory-release": True}, megatron_core="0.15.0")
    with pytest.raises(UserError, match="from a56a0b001d"):  # main's 0.16.0rc0 before the commit
        convert_args(BASE | EP | {"--ep-overlap-early-attn-memory-release": True}, releases_nodes=False)
    s = convert_args(BASE | EP | {"--ep-overlap-early-attn-memory-release": True}, megatron_core="0.17.0").sections
    assert s["framework"]["ep_overlap_early_attn_memory_release"] is True
    s = convert_args(BASE | EP | {"--pipeline-model-parallel-size": 2, "--num-layers-per-virtual-pipeline-stage": 1},
                     world_size=4).sections
    assert s["schedule"]["kind"] == "interleaved" and s["schedule"]["combined_1f1b"] is True


def test_overlap_param_gather_with_optimizer_step_maps_where_megatron_accepts_it():
    ok = BASE | {"--pipeline-model-parallel-size": 2, "--num-layers-per-virtual-pipeline-stage": 1,
                 "--use-distributed-optimizer": True, "--overlap-param-gather": True, "--ckpt-format": "torch",
                 "--overlap-param-gather-with-optimizer-step": True}
    c = convert_args(ok, world_size=4)
    assert c.sections["framework"]["overlap_param_gather_with_optimizer_step"] is True
    assert c.mapped["--overlap-param-gather-with-optimizer-step"] == "framework.overlap_param_gather_with_optimizer_step"
    # --overlap-param-gather, read only to check the combination, stays listed memory-neutral
    assert "--overlap-param-gather" in c.neutral
    assert convert_args(BASE).sections["framework"]["overlap_param_gather_with_optimizer_step"] is False
    # arguments.py: validate_args asserts each of these; the first missing one is named
    for drop, named in (("--use-distributed-optimizer", "--use-distributed-optimizer"),
                        ("--overlap-param-gather", "--overlap-param-gather"),
                        ("--num-layers-per-virtual-pipeline-stage", "an interleaved schedule"),
                        ("--ckpt-format", "--ckpt-format torch")):
        args = {k: v for k, v in ok.items() if k != drop}
        with pytest.raises(UserError, match=rf"^--overlap-param-gather-with-optimizer-step: Megatron-LM rejects it "
                                            rf"without {named}"):
            convert_args(args, world_size=4)


def test_a_resumed_run_loads_the_optimizer_state_unless_finetune_or_no_load_optim():
    fp16 = BASE | {"--fp16": True, "--bf16": False}
    fresh = convert_args(fp16).sections
    # fresh fp16: the initial loss scale overflows the first steps (no moments yet); nothing loaded
    assert (fresh["training"]["resumed"], fresh["training"]["optimizer_step"]) == (False, False)
    assert fresh["framework"]["checkpoint_format"] == "torch_dist"
    s = convert_args(fp16, resumed=True).sections
    # checkpointing.py: load_checkpoint loads the optimizer and its grad scaler: the loaded scale steps
    assert (s["training"]["resumed"], s["training"]["optimizer_step"]) == (True, True)
    for flag in ("--finetune", "--no-load-optim"):
        c = convert_args(fp16 | {flag: True}, resumed=True)
        assert (c.sections["training"]["resumed"], c.sections["training"]["optimizer_step"]) == (False, False)
        assert c.mapped[flag] == "training.resumed"
    torch = convert_args(BASE | {"--ckpt-format": "torch"}, resumed=True)
    assert torch.sections["framework"]["checkpoint_format"] == "torch"


def test_a_load_megatron_reads_otherwise_is_refused_only_when_a_checkpoint_is_loaded():
    extra = {"--ckpt-format": "fsdp_dtensor"}
    convert_args(BASE | extra)  # nothing loaded: it moves no byte
    with pytest.raises(UserError, match=r"^--ckpt-format fsdp_dtensor"):
        convert_args(BASE | extra, resumed=True)
    with pytest.raises(UserError, match=r"^--ckpt-format fsdp_dtensor"):
        convert_args(BASE | extra | {"--finetune": True})


def test_a_fully_parallel_load_is_the_plain_load_where_every_exchanged_shard_lands_in_place():
    fpl = {"--ckpt-fully-parallel-load": True}
    moe = BASE | {"--num-experts": 4, "--moe-router-topk": 2, "--expert-model-parallel-size": 2}
    # dense, DP·CP = 2: each shard is needed by both ranks and broadcast into the tensor the plain load fills
    for args, world in ((BASE, 2), (BASE | {"--context-parallel-size": 2}, 4)):
        plain = convert_args(args, world_size=world, resumed=True).sections
        assert plain["training"]["resumed"] is True
        assert convert_args(args | fpl, world_size=world, resumed=True).sections == plain
    # EP 2 over a DP·CP group of 2: each expert shard is needed by one rank only, so the exchange skips it
    for kw in ({"resumed": True}, {}):
        extra = {} if kw else {"--finetune": True}
        two = convert_args(moe | fpl | extra, world_size=2, **kw)
        assert two.sections == convert_args(moe | extra, world_size=2, **kw).sections
        assert not any("fully-parallel" in n for n in two.notes)
    # EP 2 over a DP·CP group of 4: each expert shard is needed by 2 of the 4 ranks, and broadcast to all 4; the
    # other two receive it into buffers whose lifetime is NCCL's: simulated as the plain load, with a note
    four = convert_args(moe | fpl, world_size=4, resumed=True)
    assert four.sections == convert_args(moe, world_size=4, resumed=True).sections
    note = next(n for n in four.notes if n.startswith("--ckpt-fully-parallel-load"))
    assert "DP·CP group of 4: it holds 2 different expert shards, each needed by 2 of its ranks" in note
    assert "a lower bound" in note
    # the expert-DP group holds only shards all its ranks need (dev: --ckpt-fully-parallel-load-process-group)
    ep_dp = convert_args(moe | fpl | {"--ckpt-fully-parallel-load-process-group": "ep_dp"}, world_size=4,
                         resumed=True)
    assert ep_dp.sections == convert_args(moe, world_size=4, resumed=True).sections
    assert not any("fully-parallel" in n for n in ep_dp.notes)
    with pytest.raises(UserError, match=r"^--ckpt-fully-parallel-load-exchange-algo gather_object: every rank"):
        convert_args(BASE | fpl | {"--ckpt-fully-parallel-load-exchange-algo": "gather_object"}, resumed=True)
    assert convert_args(BASE | fpl | {"--ckpt-fully-parallel-load-exchange-algo": "gather_rounds"},
                        resumed=True).sections == convert_args(BASE, resumed=True).sections
    fp8 = BASE | {"--fp8-format": "hybrid", "--fp8-recipe": "tensorwise", "--fp8-param-gather": True,
                  "--use-distributed-optimizer": True}
    with pytest.raises(UserError, match=r"^--ckpt-fully-parallel-load with FP8 parameters"):
        convert_args(fp8 | fpl, resumed=True)
    # nothing loaded, a group of one, or the torch format (no dist-checkpoint strategy): nothing to exchange
    moe_dp1 = moe | {"--tensor-model-parallel-size": 2, "--expert-tensor-parallel-size": 1}
    for args, kw in ((moe | fpl, {}), (moe_dp1 | fpl, {"resumed": True}),
                     (moe | fpl | {"--ckpt-format": "torch"}, {"resumed": True})):
        convert_args(args, world_size=2, **kw)


def test_expert_shards_spread_over_a_dp_cp_group_as_megatron_s_expert_grid_places_them():
    # (DP·CP size, tp, ep, etp) → (different expert shards in the group, ranks needing each)
    assert expert_shard_spread(8, tp=1, ep=8, etp=1) == (8, 1)  # EP over the whole group: one rank each
    assert expert_shard_spread(4, tp=2, ep=2, etp=2) == (2, 2)  # ranks 0, 2, 4, 6: EP ranks 0, 1, 0, 1
    assert expert_shard_spread(4, tp=2, ep=4, etp=1) == (2, 2)  # ranks 0, 2, 4, 6: EP ranks 0, 2, 0, 2
    assert expert_shard_spread(4, tp=1, ep=1, etp=1) == (1, 4)  # no EP: every rank needs every shard
    assert expert_shard_spread(2, tp=2, ep=1, etp=1) == (1, 2)  # expert TP 1 under TP 2: one shard per TP rank


def test_deferred_embedding_wgrad_maps_where_megatron_accepts_it():
    pp2 = BASE | {"--pipeline-model-parallel-size": 2}
    c = convert_args(pp2 | {"--defer-embedding-wgrad-compute": True, "--wgrad-deferral-limit": 2})
    assert (c.sections["framework"]["defer_embedding_wgrad"], c.sections["framework"]["wgrad_deferral_limit"]) == (
        True, 2)
    assert convert_args(pp2 | {"--wgrad-deferral-limit": 2}).sections["framework"]["defer_embedding_wgrad"] is False
    # model_parallel_config.py: ModelParallelConfig.__post_init__ raises for each of these
    for args, start in ((BASE, "--defer-embedding-wgrad-compute: Megatron-LM rejects it without pipeline"),
                        (pp2 | {"--no-gradient-accumulation-fusion": True}, "--defer-embedding-wgrad-compute with "
                                                                             "--no-gradient-accumulation-fusion"),
                        (pp2 | {"--wgrad-deferral-limit": -1}, "--wgrad-deferral-limit -1"),
                        (pp2 | {"--wgrad-deferral-limit": 1, "--mtp-num-layers": 1}, "--wgrad-deferral-limit with "
                                                                                     "--mtp-num-layers")):
        with pytest.raises(UserError, match="^" + re.escape(start)):
            convert_args(args | {"--defer-embedding-wgrad-compute": True}, world_size=4)


#: NVIDIA/Megatron-LM@60166922d3 tests/functional_tests/test_cases/gpt/gpt3_345m_nightly_dgx_a100_1N8G_tp4_pp1_
#: resume_torch/model_config.yaml, MODEL_ARGS (memory arguments; the logging and path ones left out)
LEGACY_345M = {"--num-layers": 12, "--hidden-size": 512, "--num-attention-heads": 8, "--micro-batch-size": 4,
               "--global-batch-size": 32, "--seq-length": 1024, "--max-position-embeddings": 1024,
               "--transformer-impl": "local", "--tensor-model-parallel-size": 4,
               "--pipeline-model-parallel-size": 1, "--deterministic-mode": True,
               "--no-gradient-accumulation-fusion": True, "--ckpt-format": "torch", "--use-legacy-models": True,
               "--fp16": True, "--apply-query-key-layer-scaling": True}


def test_a_legacy_functional_test_config_maps_to_the_legacy_model():
    s = convert_args(LEGACY_345M, world_size=8, megatron_core="0.11.0").sections
    assert s["framework"]["use_legacy_models"] is True
    assert s["framework"]["transformer_impl"] == "local" and s["framework"]["attention_backend"] == "local"
    assert s["framework"]["attention_softmax_in_fp32"] is True
    assert (s["parallel"]["tp"], s["parallel"]["dp"], s["training"]["dtype"]) == (4, 2, "fp16")
    assert "use_legacy_models" not in convert_args(BASE).sections["framework"]  # written only when given


def test_a_legacy_job_under_transformer_engine_maps_to_te_layers():
    """transformer.py: ParallelTransformer.build_layer builds TE's TransformerLayer under transformer_engine (the
    parser's default); --use-flash-attn, read only by the legacy local attention, is then accepted."""
    te = {k: v for k, v in LEGACY_345M.items() if k != "--transformer-impl"} | {"--use-flash-attn": True}
    s = convert_args(te, world_size=8, megatron_core="0.11.0").sections
    assert s["framework"]["use_legacy_models"] is True
    assert s["framework"].get("transformer_impl", "transformer_engine") == "transformer_engine"
    # Core's LanguageModule._set_attention_backend is what applies --attention-backend; the legacy model never
    # calls it, so TE's TransformerLayer chooses as under auto: FlashAttention on a deterministic A100, cuDNN's
    # fused attention on an H100
    for gpu, chosen in (("a100", "flash"), ("h100", "fused")):
        unfused = te | {"--attention-backend": "unfused", "--deterministic-mode": True, "--bf16": True}
        unfused.pop("--fp16")
        sections = convert(from_mapping(unfused), world_size=8, megatron_core="0.11.0", gpu=gpu,
                           te_version="2.0").sections
        assert sections["framework"]["attention_backend"] == chosen, gpu
    bert = from_mapping(te | {"--vocab-size": 30522}, family="bert", family_source="the path test_cases/bert/")
    with pytest.raises(UserError, match="^--use-legacy-models with --transformer-impl transformer_engine on a BERT"):
        convert(bert, world_size=8, megatron_core="0.11.0")


def test_a_legacy_bert_job_under_te_before_1_10_runs_the_unfused_attention_on_its_mask(tmp_path):
    """The legacy BertModel's [b, 1, s, s] mask: TE's unfused attention before 1.10 applies it as given (from 1.10
    it asserts a [b, 1, 1, s] one). On a deterministic A100 TE 1.2 chooses the unfused attention itself (flash-attn
    off for determinism before TE 1.3, cuDNN's below sm90); TE 1.10 chooses FlashAttention, which unpads the
    sequences by the mask: refused."""
    args = {k: v for k, v in LEGACY_345M.items() if k not in ("--transformer-impl", "--fp16",
                                                                "--apply-query-key-layer-scaling")}
    args |= {"--bf16": True, "--vocab-size": 30522, "--seq-length": 512, "--max-position-embeddings": 512}
    bert = from_mapping(args, family="bert", family_source="the path test_cases/bert/")
    conv = convert(bert, world_size=8, megatron_core="0.11.0", gpu="a100", te_version="1.2")
    fw = conv.sections["framework"]
    assert (fw["use_legacy_models"], fw.get("transformer_impl", "transformer_engine"), fw["attention_backend"]) == (
        True, "transformer_engine", "unfused")
    run = run_from_data(tomllib.loads(run_file_text(conv, name="legacy-bert", source="x", world_size=8)),
                        tmp_path / "legacy-bert.toml")
    assert run.model.architecture == "bert" and run.framework.use_legacy_models
    with pytest.raises(UserError, match="TE 1.10's flash attention \\(the one it chooses\\) unpads"):
        convert(bert, world_size=8, megatron_core="0.11.0", gpu="a100", te_version="1.10")


def test_legacy_experts_are_the_switch_mlp():
    """transformer.py: ParallelTransformerLayer builds SwitchMLP in every layer under --num-experts: top-1
    (sinkhorn), experts of --ffn-hidden-size, no shared experts, whatever the MoE arguments say."""
    args = LEGACY_345M | {"--num-experts": 4, "--moe-router-topk": 2, "--moe-ffn-hidden-size": 1024,
                          "--moe-shared-expert-intermediate-size": 512, "--moe-layer-freq": 2,
                          "--sequence-parallel": True}
    m = convert_args(args, world_size=8, megatron_core="0.11.0").sections["model"]
    assert (m["n_routed_experts"], m["num_experts_per_tok"], m["moe_intermediate_size"]) == (4, 1, 4 * 512)
    assert (m["n_shared_experts"], m["first_k_dense_replace"], m["moe_layer_freq"]) == (0, 0, 1)


def test_a_legacy_local_job_with_flash_attn_maps_to_flash_self_attention():
    """transformer.py: ParallelAttention.forward runs FlashSelfAttention under --use-flash-attn (local layer only),
    in place of CoreAttention, which alone selective recompute checkpoints: nothing is recomputed then."""
    conv = convert_args(LEGACY_345M | {"--use-flash-attn": True, "--recompute-activations": True}, world_size=8,
                        megatron_core="0.11.0")
    assert conv.sections["framework"]["legacy_flash_attn"] is True
    assert "recompute" not in conv.sections
    assert any("FlashSelfAttention replaces" in n for n in conv.notes)
    te = {k: v for k, v in LEGACY_345M.items() if k != "--transformer-impl"} | {"--use-flash-attn": True}
    assert "legacy_flash_attn" not in convert_args(te, world_size=8, megatron_core="0.11.0").sections["framework"]


@pytest.mark.parametrize("extra,start", [
    ({"--num-experts": 4, "--transformer-impl": "transformer_engine"},
     "--num-experts with --use-legacy-models: TE's TransformerLayer"),
    ({"--qk-layernorm": True}, "--qk-layernorm with --use-legacy-models"),
    ({"--context-parallel-size": 2}, "--context-parallel-size with --use-legacy-models"),
    ({"--ckpt-format": "torch_dist"}, "--ckpt-format torch_dist with --use-legacy-models"),
    ({"--position-embedding-type": "yarn"}, "--position-embedding-type yarn with --use-legacy-models"),
    ({"--recompute-granularity": "selective", "--recompute-modules": ["mlp"]},
     "--recompute-modules mlp with --use-legacy-models"),
])
def test_what_the_legacy_path_cannot_run_is_refused_naming_the_flag(extra, start):
    with pytest.raises(UserError, match="^" + re.escape(start)):
        convert_args(LEGACY_345M | extra, world_size=8)


def test_fp8_arguments_map_to_the_recipe_and_fp8_parameters():
    fp8 = BASE | {"--fp8-format": "hybrid", "--fp8-recipe": "tensorwise", "--fp8-param-gather": True,
                  "--use-distributed-optimizer": True, "--tp-comm-overlap": True, "--tensor-model-parallel-size": 2,
                  "--sequence-parallel": True}
    s = convert_args(fp8).sections
    assert (s["training"]["fp8_recipe"], s["training"]["fp8_param_gather"]) == ("tensorwise", True)
    assert s["framework"]["tp_comm_overlap"] is True
    assert convert_args(BASE | {"--fp8-format": "e4m3"}).sections["training"]["fp8_recipe"] == "delayed"
    for recipe in ("blockwise", "mxfp8"):
        assert convert_args(BASE | {"--fp8-format": "e4m3", "--fp8-recipe": recipe}).sections["training"][
            "fp8_recipe"] == recipe
    mx = convert_args(BASE | {"--fp8-format": "e4m3", "--fp8-recipe": "mxfp8", "--fp8-param-gather": True,
                              "--use-distributed-optimizer": True}).sections["training"]
    assert mx["fp8_param_gather"] is True  # MXFP8 parameters (tests/graph/test_fp8.py)
    blockwise = convert_args(BASE | {"--fp8-format": "e4m3", "--fp8-recipe": "blockwise", "--fp8-param-gather": True,
                                     "--use-distributed-optimizer": True}).sections["training"]
    assert blockwise["fp8_param_gather"] is True
    with pytest.raises(UserError, match="--fp8-recipe custom: "):
        convert_args(BASE | {"--fp8-format": "e4m3", "--fp8-recipe": "custom"})
    with pytest.raises(UserError, match="--fp8-param-gather: .*add --use-distributed-optimizer"):
        convert_args(BASE | {"--fp8-format": "e4m3", "--fp8-param-gather": True})
    hist = convert_args(BASE | {"--fp8-format": "e4m3", "--fp8-amax-history-len": 1024}).sections["training"]
    assert hist["fp8_amax_history_len"] == 1024
    tensorwise = {"--fp8-format": "e4m3", "--fp8-recipe": "tensorwise", "--fp8-amax-history-len": 1024}
    assert "fp8_amax_history_len" not in convert_args(BASE | tensorwise).sections["training"]
    bf16 = BASE | {"--fp8-format": "e4m3", "--fp8-recipe": "tensorwise", "--first-last-layers-bf16": True,
                   "--num-layers-at-end-in-bf16": 2}
    tr = convert_args(bf16).sections["training"]
    assert (tr["fp8_bf16_first_layers"], tr["fp8_bf16_last_layers"]) == (1, 2)
    with pytest.raises(UserError, match="--first-last-layers-bf16 under the delayed recipe"):
        convert_args(BASE | {"--fp8-format": "e4m3", "--first-last-layers-bf16": True})
    assert "fp8_bf16_first_layers" not in convert_args(BASE | {"--first-last-layers-bf16": True}).sections["training"]


def test_fp8_under_the_local_layers_is_the_bf16_run_with_a_note():
    """Megatron's local linears ignore TE's fp8_autocast: the run file is the bf16 one, the FP8 arguments listed
    memory-neutral; the local experts' FP8 padding and FP8 parameters stay refused in one line."""
    local = BASE | {"--transformer-impl": "local", "--tensor-model-parallel-size": 2, "--sequence-parallel": True}
    fp8 = {"--fp8-format": "hybrid", "--fp8-recipe": "tensorwise", "--fp8-amax-history-len": 16,
           "--first-last-layers-bf16": True}
    plain, c = convert_args(local), convert_args(local | fp8)
    assert c.sections == plain.sections
    assert all(c.neutral[name].startswith("the local layers' linears ignore TE's fp8_autocast") for name in fp8)
    assert any(n.startswith("--fp8-format --fp8-recipe --fp8-amax-history-len --first-last-layers-bf16: the local")
               for n in c.notes)
    with pytest.raises(UserError, match="--transformer-impl local on a MoE model: .*SequentialMLP"):
        convert_args(local | fp8 | {"--num-experts": 4})
    with pytest.raises(UserError, match="--fp8-param-gather with --transformer-impl local"):
        convert_args(local | fp8 | {"--fp8-param-gather": True, "--use-distributed-optimizer": True})
    with pytest.raises(UserError, match="--first-last-layers-bf16 under the delayed recipe"):
        convert_args(local | {"--fp8-format": "e4m3", "--first-last-layers-bf16": True})


#: Megatron-LM tests/functional_tests/test_cases/hybrid/hybrid_mr_mcore_te_tp1_pp2_vpp2_cp1_dgx_a100_1N8G/
#: model_config.yaml at e4533afdfa (2026-04-12): its memory-relevant MODEL_ARGS
HYBRID_ARGS = {"--hidden-size": 1024, "--num-attention-heads": 16, "--group-query-attention": True,
               "--num-query-groups": 8, "--hybrid-layer-pattern": "M-M-M-M*-M-|M-M-M*-M-M-|M-M*-M-M-M-|M*-M-M-M-M-",
               "--spec": "[megatron.core.models.mamba.mamba_layer_specs mamba_stack_spec]",
               "--micro-batch-size": 4, "--global-batch-size": 32, "--seq-length": 1024,
               "--max-position-embeddings": 1024, "--transformer-impl": "transformer_engine",
               "--tensor-model-parallel-size": 1, "--pipeline-model-parallel-size": 2,
               "--use-distributed-optimizer": True, "--overlap-grad-reduce": True, "--overlap-param-gather": True,
               "--no-gradient-accumulation-fusion": True, "--attention-softmax-in-fp32": True, "--bf16": True,
               "--attention-backend": "unfused", "--vocab-file": "vocab.json", "--merge-file": "merges.txt"}


def test_hybrid_layer_pattern_sets_kinds_layers_and_virtual_stages():
    c = convert_args(HYBRID_ARGS, world_size=8, megatron_core="0.18.0")
    model, par = c.sections["model"], c.sections["parallel"]
    assert model["hybrid_override_pattern"] == "M-M-M-M*-M-M-M-M*-M-M-M-M*-M-M-M-M*-M-M-M-M-"
    assert model["num_layers"] == 44
    assert (model["mamba_head_dim"], model["ssm_state_size"], model["n_groups"], model["mamba_num_heads"]) == \
        (64, 128, 8, 0)
    assert par["vpp"] == 2 and par["layout"] == [11, 11, 11, 11] and c.sections["schedule"]["kind"] == "interleaved"


def test_hybrid_ratios_allocate_as_megatron_does():
    """mamba_hybrid_layer_allocation.py: _allocate_auto(10, 0.2, 0.0), traced by hand: sections of 8/3 Mamba
    layers, x = 2.67 → 1.67 → 0.67 → −0.33 (attention at 3, x = 2.33) → 1.33 → 0.33 (attention at 6) → …;
    an MLP ratio then replaces Mamba layers, right-justified."""
    from timeline.io.megatron_hybrid import allocate_auto
    assert allocate_auto(10, 0.2, 0.0) == "MMM*MM*MMM"
    assert allocate_auto(8, 0.25, 0.25).count("-") == 2 and allocate_auto(8, 0.25, 0.25).count("*") == 2


def test_hybrid_refusals_are_one_line():
    with pytest.raises(UserError, match="an MTP depth of 'MM' is not modelled"):
        convert_args({**HYBRID_ARGS, "--hybrid-layer-pattern": "M*M*/MM"}, world_size=8, megatron_core="0.18.0")
    with pytest.raises(UserError, match="every MTP depth's pattern to be the same"):
        convert_args({**HYBRID_ARGS, "--hybrid-layer-pattern": "M*M-/*-/*E"}, world_size=8, megatron_core="0.18.0")
    with pytest.raises(UserError, match="an MTP depth with an MoE layer in a dense model"):
        convert_args({**HYBRID_ARGS, "--hybrid-layer-pattern": "M*M-/*E"}, world_size=8, megatron_core="0.18.0")
    with pytest.raises(UserError, match="--disable-mamba-mem-eff-path"):
        convert_args({**HYBRID_ARGS, "--disable-mamba-mem-eff-path": True}, world_size=8, megatron_core="0.18.0")


def test_a_hybrid_patterns_mtp_depths_are_transformer_layers():
    """hybrid_layer_allocation.py: parse_hybrid_pattern (d98e8a64dd) — 'main/*-/*-' is two MTP depths of an
    attention and an MLP layer; validate_args takes --mtp-num-layers from them (a conflicting one: a note); the
    deprecated --mtp-hybrid-override-pattern with --mtp-num-layers N is the same pattern repeated N times."""
    args = {**HYBRID_ARGS, "--hybrid-layer-pattern": "M*M-/*-/*-", "--pipeline-model-parallel-size": 1}
    c = convert_args(args, world_size=8, megatron_core="0.18.0")
    assert c.sections["model"]["hybrid_override_pattern"] == "M*M-" and c.sections["model"]["mtp_layers"] == 2
    c = convert_args(args | {"--mtp-num-layers": 3}, world_size=8, megatron_core="0.18.0")
    assert c.sections["model"]["mtp_layers"] == 2 and any("takes the pattern's" in n for n in c.notes)
    legacy = {**args, "--hybrid-layer-pattern": "M*M-", "--mtp-hybrid-override-pattern": "*-", "--mtp-num-layers": 3}
    assert convert_args(legacy, world_size=8, megatron_core="0.18.0").sections["model"]["mtp_layers"] == 3


def test_mtp_use_repeated_layer_is_one_modules_parameters():
    """transformer_config.py (core_v0.17.0 on): --mtp-use-repeated-layer builds one MTP layer for every depth —
    memory, not numerics (it was listed memory-neutral before); without MTP it changes nothing."""
    c = convert_args(BASE | {"--mtp-num-layers": 2, "--mtp-use-repeated-layer": True}, megatron_core="0.17.0")
    assert c.sections["model"]["mtp_layers"] == 2 and c.sections["model"]["mtp_repeated_layer"] is True
    c = convert_args(BASE | {"--mtp-use-repeated-layer": True}, megatron_core="0.17.0")
    assert "mtp_repeated_layer" not in c.sections["model"]


def test_a_world_size_the_expert_ranks_do_not_divide_is_refused_as_megatron_does():
    moe = BASE | {"--num-experts": 4, "--moe-router-topk": 2, "--expert-model-parallel-size": 4}
    assert convert_args(moe, world_size=4).sections["parallel"]["ep"] == 4
    with pytest.raises(UserError, match=r"^--world-size 2 is not divisible by etp·ep·pp = 1·4·1 "):
        convert_args(moe, world_size=2)
    with pytest.raises(UserError, match=r"^--world-size 4 is not divisible by etp·ep·pp = 2·4·1 "):
        convert_args(moe | {"--tensor-model-parallel-size": 2}, world_size=4)


def test_no_position_embedding_builds_neither_a_table_nor_rotary(tmp_path):
    """``--position-embedding-type none`` (gpt_model.py / hybrid_model.py's default): no position table, no RoPE."""
    from sources import template_of, tensors_of

    base = BASE | {"--max-position-embeddings": 512}
    params, ops = {}, {}
    for pos in ("none", "rope", "learned_absolute"):
        c = convert_args(base | {"--position-embedding-type": pos}, world_size=1)
        assert c.sections["model"]["position_embedding"] == {"none": "none", "rope": "rope"}.get(pos, "learned")
        run = run_from_data(tomllib.loads(run_file_text(c, name="nope", source="x", world_size=1)), tmp_path / "r.toml")
        params[pos] = {t.name for t in tensors_of(run, 0)[1]}
        ops[pos] = {op.name for op in template_of(run, 0).forward}
    assert not any("position_embeddings" in n for n in params["none"])
    assert any("position_embeddings" in n for n in params["learned_absolute"])
    assert any(n.endswith(".rope") for n in ops["rope"]) and not any(n.endswith(".rope") for n in ops["none"])


def test_a_hybrid_spec_given_as_two_words_is_the_hybrid_stack():
    """A launch script passes ``--spec MODULE FUNCTION`` as two words (a tuple), a YAML as one string."""
    from timeline.io.megatron_args import parse_arg_list

    margs = parse_arg_list("--num-layers 4 --hidden-size 256 --num-attention-heads 8 --seq-length 512 "
                           "--micro-batch-size 1 --global-batch-size 8 --bf16 --vocab-size 1024 "
                           "--tokenizer-type NullTokenizer --hybrid-layer-pattern M*M* "
                           "--spec megatron.core.models.hybrid.hybrid_layer_specs hybrid_stack_spec\n")
    c = convert(margs, world_size=1)
    assert c.sections["model"]["hybrid_override_pattern"] == "M*M*"


def test_the_attention_output_gate_widens_linear_qkv_and_gates_the_context(tmp_path):
    """``--attention-output-gate`` (attention.py): linear_qkv grows by heads · kv_channels (its bias too), and
    ``_apply_output_gate`` keeps its two bf16 inputs (the context, the gate view of mixed_qkv) and hands
    linear_proj a new q-wide tensor; MLA is rejected as Megatron rejects it."""
    from sources import template_of, tensors_of

    base = BASE | {"--max-position-embeddings": 512, "--position-embedding-type": "rope",
                   "--tensor-model-parallel-size": 2}
    runs = {}
    for gated in (False, True):
        c = convert_args(base | ({"--attention-output-gate": True} if gated else {}), world_size=2)
        assert c.sections["model"].get("attention_output_gate", False) is gated
        runs[gated] = run_from_data(tomllib.loads(run_file_text(c, name="g", source="x", world_size=2)),
                                    tmp_path / f"{gated}.toml")
    q_local = 256 // 2  # 8 heads of 32 over tp 2
    params = {g: {t.name: t for t in tensors_of(run, 0)[1]} for g, run in runs.items()}
    extra = {n: t for n, t in params[True].items() if n not in params[False]}
    assert sorted(n.rsplit(".", 2)[-2:][0] for n in extra) == ["g_proj"] * 8  # weight and bias, 4 layers
    assert all(t.shape == (q_local, 256) for n, t in extra.items() if n.endswith("weight"))
    ops = {g: {op.name: op for op in template_of(run, 0).forward} for g, run in runs.items()}
    gate_ops = [op for name, op in ops[True].items() if name.endswith(".output_gate")]
    assert len(gate_ops) == 4 and not any(n.endswith(".output_gate") for n in ops[False])
    rows = 512 * 2  # seq · micro-batch
    qkv = {g: next(op for name, op in ops[g].items() if name.endswith("layers.0.self_attn.linear_qkv"))
           for g in runs}
    widths = {g: sum(t.shape[-1] for t in op.allocs) for g, op in qkv.items()}
    assert widths[True] - widths[False] == q_local
    assert [t.shape for t in gate_ops[0].allocs] == [(rows, q_local)]
    saved = {g: template_of(run, 0).activation_bytes for g, run in runs.items()}
    # per layer: the gate, a view, pins all of mixed_qkv (q, gate, k, v: here nothing else keeps it — TE's flash
    # attention keeps rotated q/k and its own v), and linear_proj keeps the gated context; bf16
    assert saved[True] - saved[False] == 4 * (rows * 4 * q_local * 2 + rows * q_local * 2)
    with pytest.raises(UserError, match="not supported for MLA"):
        convert_args(base | {"--attention-output-gate": True, "--multi-latent-attention": True})


def test_the_attention_output_gate_is_a_megatron_profile_layer(tmp_path):
    c = convert_args(BASE | {"--attention-output-gate": True, "--position-embedding-type": "rope"}, world_size=2)
    data = tomllib.loads(run_file_text(c, name="g", source="x", world_size=2))
    data["model"]["profile"] = "paper"
    with pytest.raises(UserError, match="model.attention_output_gate"):
        run_from_data(data, tmp_path / "g.toml")


def test_a_forks_own_arguments_can_be_passed_over(tmp_path):
    """``ignored``: arguments of no Megatron-LM version (Pai-Megatron-Patch's ``--extra-vocab-size``) are dropped
    and listed apart in the run file; Megatron-LM's own cannot be; without it the error names the way out."""
    args = BASE | {"--extra-vocab-size": "256", "--train-mode": "pretrain"}
    with pytest.raises(UserError) as err:  # all of them in one line, with the one --ignore-arg that passes over them
        convert_args(args)
    assert str(err.value) == (
        "2 arguments are not arguments of Megatron-LM's training parser (core_v0.12.0 … main): --extra-vocab-size "
        "(did you mean --export-draft-vocab-size or --vocab-size or --padded-vocab-size?), --train-mode (did you mean "
        "--rerun-mode?); if they are a fork's (or a pre-core_v0.12 Megatron-LM's) own arguments, --ignore-arg "
        "extra-vocab-size,train-mode passes over them; a job of a Megatron-LM later than main (--megatron-core 0.20.0 "
        "or later) has them passed over with a note")
    with pytest.raises(UserError, match="^--train-mode: not an argument .*; did you mean --rerun-mode\\?; if it is a "
                                        "fork's .* own argument, --ignore-arg train-mode passes over it; a job of a "
                                        "Megatron-LM later than main .* passed over with a note$"):
        convert_args(args, ignored=("--extra-vocab-size",))
    c = convert_args(args, ignored=("--extra-vocab-size", "--train-mode", "--not-given"))
    assert c.passed_over == ["--extra-vocab-size", "--train-mode"]
    assert "--extra-vocab-size" not in c.neutral and "--extra-vocab-size" not in c.mapped
    text = run_file_text(c, name="fork", source="x", world_size=2)
    assert "# passed over (--ignore-arg): not Megatron-LM arguments" in text and "#   --train-mode" in text
    assert convert_args(BASE).sections == c.sections  # nothing of them reaches the run
    with pytest.raises(UserError, match="--ignore-arg --bf16: a Megatron-LM argument"):
        convert_args(args, ignored=("--bf16",))


def test_from_megatron_ignore_arg_takes_names_without_dashes(tmp_path, capsys):
    from timeline.cli import main

    path = tmp_path / "args.txt"
    path.write_text("--num-layers 4 --hidden-size 256 --num-attention-heads 8 --seq-length 512 "
                    "--max-position-embeddings 512 --micro-batch-size 2 --global-batch-size 16 --bf16 "
                    "--extra-vocab-size 256 --dataset LLama-Pretrain-Idxmap\n")
    out = tmp_path / "job.toml"
    assert main(["from-megatron", str(path), "--world-size", "2", "-o", str(out)]) == 2
    assert "--ignore-arg extra-vocab-size" in capsys.readouterr().err and not out.exists()
    assert main(["from-megatron", str(path), "--world-size", "2", "-o", str(out), "--ignore-arg",
                 "extra-vocab-size", "--ignore-arg=--dataset"]) == 0
    text = out.read_text()
    assert "--ignore-arg dataset,extra-vocab-size" in text.splitlines()[0]
    assert "#   --dataset" in text


def test_the_legacy_rope_flag_sets_rope():
    """arguments.py: validate_args ("Legacy RoPE arguments") sets position_embedding_type = 'rope' under
    --use-rotary-position-embeddings, before its --no-position-embedding check (FlagScale's Aquila scripts)."""
    c = convert_args(BASE | {"--use-rotary-position-embeddings": True, "--no-position-embedding": True})
    assert c.sections["model"]["position_embedding"] == "rope"
    assert c.mapped["--use-rotary-position-embeddings"] == "model.position_embedding"
    with pytest.raises(UserError, match="--no-position-embedding with --position-embedding-type learned_absolute"):
        convert_args(BASE | {"--no-position-embedding": True})


def test_a_ramp_up_given_as_three_words_starts_at_its_first():
    c = convert_args(BASE | {"--global-batch-size": "64", "--rampup-batch-size": ("32", "32", "1000")})
    assert c.sections["training"]["num_microbatches"] * c.sections["training"]["micro_batch_size"] * \
        c.sections["parallel"]["dp"] == 32
    with pytest.raises(UserError, match=r"^--rampup-batch-size 32 32: expected three integers"):
        convert_args(BASE | {"--rampup-batch-size": ("32", "32")})


def test_fp16_lm_cross_entropy_is_read_only_by_the_legacy_model():
    """gpt_model.py stores fp16_lm_cross_entropy and never reads it (core_v0.12.0 … main): memory-neutral on the
    Megatron-Core model; validate_args asserts --fp16; the legacy model's loss reads it (refused there)."""
    fp16 = {k: v for k, v in BASE.items() if k != "--bf16"} | {"--fp16": True, "--fp16-lm-cross-entropy": True}
    c = convert_args(fp16)
    assert "--fp16-lm-cross-entropy" in c.neutral and convert_args(
        {k: v for k, v in fp16.items() if k != "--fp16-lm-cross-entropy"}).sections == c.sections
    with pytest.raises(UserError, match="^--fp16-lm-cross-entropy without --fp16: Megatron-LM refuses it"):
        convert_args(BASE | {"--fp16-lm-cross-entropy": True})
    with pytest.raises(UserError, match="^--fp16-lm-cross-entropy with --use-legacy-models: the legacy model's"):
        convert_args(fp16 | {"--use-legacy-models": True, "--transformer-impl": "local"})


def test_pretrain_gpt_builds_gpt_model_whatever_the_hybrid_arguments_say():
    """pretrain_gpt.py's model_provider builds GPTModel (core_v0.14.0 … core_v0.19.0); --is-hybrid-model and
    --hybrid-override-pattern reach only FLOP counting there. pretrain_mamba.py (or an argument list naming no
    entry) builds the hybrid stack."""
    moe = BASE | {"--num-experts": 8, "--moe-ffn-hidden-size": 256, "--moe-router-topk": 2,
                  "--is-hybrid-model": True, "--hybrid-override-pattern": "M-*-"}
    gpt = convert(from_mapping(moe, family="gpt", family_source="the script pretrain_gpt.py"), world_size=2)
    assert "hybrid_override_pattern" not in gpt.sections["model"]
    assert gpt.mapped["--hybrid-override-pattern"] == "(read by FLOP counting only)"
    assert any("pretrain_gpt.py builds GPTModel" in n for n in gpt.notes)
    mamba = convert(from_mapping(moe, family="mamba", family_source="the script pretrain_mamba.py"), world_size=2)
    assert mamba.sections["model"]["hybrid_override_pattern"] == "M-*-"
    assert not any("GPTModel" in n for n in mamba.notes)
    assert convert_args(moe).sections["model"]["hybrid_override_pattern"] == "M-*-"


def test_no_tokenizer_argument_takes_gpt2_s_vocabulary_with_a_note():
    c = convert_args(BASE)
    assert c.sections["model"]["vocab_size"] == 50257
    assert any("name no tokenizer" in n for n in c.notes)
    assert not convert_args(BASE | {"--vocab-file": "vocab.json"}, megatron_core="0.19.0").notes


def test_tp_above_the_kv_groups_names_megatron_s_support_and_what_is_not_modelled():
    import tomllib
    from pathlib import Path

    from timeline.io.megatron_write import run_file_text
    from timeline.io.runfile import run_from_data

    gqa = BASE | {"--group-query-attention": True, "--num-query-groups": 2, "--tensor-model-parallel-size": 4}
    text = run_file_text(convert_args(gqa, world_size=4, megatron_core="0.15.0"), name="gqa", source="-",
                         world_size=4)
    with pytest.raises(UserError, match="Megatron-Core from 0.16 runs tp above the KV groups"):
        run_from_data(tomllib.loads(text), Path("gqa.toml"))


def test_mup_scales_copies_of_the_embeddings_and_the_logits():
    """--use-mup (Megatron-Core core_v0.17.0 on): mup_width_mult = hidden / --mup-base-hidden-size, an output
    multiplier left at 1 becomes 1 / width; LanguageModelEmbedding multiplies the embeddings, GPTModel's
    _scale_logits the logits — each a new tensor of its input's size (a Python-float multiply keeps nothing)."""
    import numpy as np

    from timeline.io.megatron_write import run_file_text
    from timeline.io.runfile import run_from_data
    from timeline.result.build import build_timeline

    args = BASE | {"--use-mup": True, "--mup-base-hidden-size": "16", "--mup-embedding-mult": "10",
                   "--mup-attn-scale-power": "1.0"}
    c = convert_args(args)
    hidden = int(BASE["--hidden-size"])
    assert c.sections["model"]["mup_embedding_mult"] == 10.0
    assert c.sections["model"]["mup_output_mult"] == 16 / hidden
    assert c.mapped["--use-mup"].startswith("model.mup_embedding_mult") and "--mup-attn-scale-power" in c.neutral
    # an explicit output multiplier wins; no base: width 1, the logits unscaled
    assert convert_args(args | {"--mup-output-mult": "0.5"}).sections["model"]["mup_output_mult"] == 0.5
    plain = convert_args(BASE | {"--use-mup": True})
    assert plain.sections["model"]["mup_output_mult"] == 1.0 and plain.sections["model"]["mup_embedding_mult"] == 1.0
    # without --use-mup its multipliers read nothing
    assert "mup_output_mult" not in convert_args(BASE | {"--mup-output-mult": "0.5"}).sections["model"]
    with pytest.raises(UserError, match="^--use-mup with --use-legacy-models"):
        convert_args(args | {"--use-legacy-models": True})
    import tomllib
    from pathlib import Path

    tl = build_timeline(run_from_data(tomllib.loads(run_file_text(c, name="mup", source="<test>", world_size=2)),
                                      Path("<test>/mup.toml")))
    ev = tl.events(0)
    names = np.array(tl.sim.names)[ev.tensor].astype(str)
    made = {n: int(ev.size[i]) for i, n in enumerate(names) if ev.sign[i] > 0}
    assert made["output.output_layer.mup_scaled"] == made["output.output_layer.out"]
    assert made["embedding.mup_scaled"] == made["embedding.out"]


def test_no_pad_vocab_size_is_read_with_a_padded_vocab_size():
    """--no-pad-vocab-size (core_v0.18.0 on): build_tokenizer.py's _set_padded_vocab_size runs only under
    pad_vocab_size and fills only an unset padded_vocab_size, so with --padded-vocab-size the model has that many
    rows either way, and without it none: Megatron fails, and so does the conversion, in one line."""
    args = BASE | {"--tokenizer-type": "NullTokenizer", "--vocab-size": "1000", "--padded-vocab-size": "1000"}
    c = convert_args(args | {"--no-pad-vocab-size": True}, megatron_core="0.18.0")
    assert c.sections["model"]["vocab_size"] == 1000 and c.mapped["--no-pad-vocab-size"] == "model.vocab_size"
    assert c.sections == convert_args(args, megatron_core="0.18.0").sections
    without = {k: v for k, v in args.items() if k != "--padded-vocab-size"}
    with pytest.raises(UserError, match="^--disable-pad-vocab-size without --padded-vocab-size: Megatron-LM then "
                                        "sets no padded vocabulary"):
        convert_args(without | {"--disable-pad-vocab-size": True}, megatron_core="0.18.0")


def test_a_pretrained_checkpoint_is_a_finetune_load_unless_the_run_resumes():
    """checkpointing.py: load_checkpoint (core_v0.12.0 … d98e8a64dd): where --load holds no checkpoint the
    --pretrained-checkpoint one is loaded with args.finetune = True (the weights alone, the moments made in the
    first step); a resumed run (--resumed: --load holds this training's checkpoint) loads --load's optimizer too."""
    pre = BASE | {"--pretrained-checkpoint": "/ckpt/base", "--load": "/ckpt/run"}
    first = convert_args(pre)
    assert first.sections["training"]["resumed"] is False and first.mapped["--pretrained-checkpoint"] == \
        "training.resumed"
    assert first.sections == convert_args(BASE | {"--load": "/ckpt/run", "--finetune": True}).sections
    assert convert_args(pre, resumed=True).sections["training"]["resumed"] is True
    # a finetune load of a format not modelled is refused as --finetune's is
    with pytest.raises(UserError, match=r"^--ckpt-format fsdp_dtensor"):
        convert_args(pre | {"--ckpt-format": "fsdp_dtensor"})


def test_main_params_from_the_checkpoint_need_no_load_optim():
    """--load-main-params-from-ckpt: Megatron-LM asserts --no-load-optim with it (arguments.py: validate_args);
    reload_model_params then fills the main parameters from the loaded state dict in place, so the iterations hold
    --no-load-optim's state."""
    args = BASE | {"--load": "/ckpt", "--no-load-optim": True}
    c = convert_args(args | {"--load-main-params-from-ckpt": True}, resumed=True)
    assert c.sections == convert_args(args, resumed=True).sections
    assert c.mapped["--load-main-params-from-ckpt"] == "training.resumed"
    with pytest.raises(UserError, match="^--load-main-params-from-ckpt without --no-load-optim: Megatron-LM rejects"):
        convert_args(BASE | {"--load": "/ckpt", "--load-main-params-from-ckpt": True}, resumed=True)


def test_router_input_jitter_keeps_its_noise_and_the_jittered_copy():
    """--moe-input-jitter-eps (router.py: apply_input_jitter): `input * Uniform(1 - eps, 1 + eps).rsample(shape)`
    before the gating GEMM — rsample's rand, scaled and noise tensors in turn, none taking a gradient; the multiply
    keeps the noise, the gate its jittered input: two [tokens, hidden] tensors per MoE layer until its backward."""
    import tomllib
    from pathlib import Path

    import numpy as np

    from timeline.io.megatron_write import run_file_text
    from timeline.io.runfile import run_from_data
    from timeline.result.build import build_timeline

    moe = BASE | {"--num-experts": 4, "--moe-router-topk": 2, "--moe-token-dispatcher-type": "alltoall",
                  "--moe-grouped-gemm": True}
    c = convert_args(moe | {"--moe-input-jitter-eps": "0.01"})
    assert c.sections["framework"]["moe_input_jitter"] is True
    assert c.mapped["--moe-input-jitter-eps"] == "framework.moe_input_jitter"
    with pytest.raises(UserError, match="^--moe-input-jitter-eps 0: torch.s Uniform.*give a positive eps"):
        convert_args(moe | {"--moe-input-jitter-eps": "0"})
    tl = build_timeline(run_from_data(tomllib.loads(run_file_text(c, name="jitter", source="<test>", world_size=2)),
                                      Path("<test>/jitter.toml")))
    ev = tl.events(0)
    names = np.array(tl.sim.names)[ev.tensor].astype(str)
    tokens_hidden = 2 * 512 * 256 * 2  # micro-batch 2 × 512 tokens × hidden 256, bf16

    def life(name: str) -> list[tuple[float, int, int]]:
        return [(float(ev.t_us[i]), int(ev.sign[i]), int(ev.size[i])) for i in np.flatnonzero(names == name)]

    first_backward = min(s.start_us for s in tl.sim.spans[0] if s.kind in ("B", "I"))
    for kept in ("layers.0.mlp.router.jitter_noise", "layers.0.mlp.router.jittered"):
        (made, _, size), (freed, _, _) = life(kept)[:2]
        assert size == tokens_hidden and freed >= first_backward > made
    (made, _, _), (freed, _, _) = life("layers.0.mlp.router.jitter_rand")[:2]
    assert freed < first_backward  # a forward transient
    assert not any(n.startswith("grad:") and "jitter_noise" in n for n in set(names))


def test_distributed_checkpoint_inputs_keep_a_tp_chunk_and_gather_it_back():
    """--distribute-saved-activations (tensor_parallel/random.py: CheckpointFunction): after each full-recompute
    region's forward its input is copied into a new 1/tp buffer and the whole one released; the backward
    all-gathers a whole buffer again before the recompute, then releases the chunk. Megatron-LM's own checks
    (arguments.py: validate_args; transformer_config.py: __post_init__) are refusals."""
    import tomllib
    from pathlib import Path

    import numpy as np

    from timeline.io.megatron_write import run_file_text
    from timeline.io.runfile import run_from_data
    from timeline.result.build import build_timeline

    full = BASE | {"--tensor-model-parallel-size": 2, "--recompute-granularity": "full",
                   "--recompute-method": "uniform", "--recompute-num-layers": 1}
    c = convert_args(full | {"--distribute-saved-activations": True})
    assert c.sections["recompute"]["distribute_saved"] is True
    for extra, why in (({"--sequence-parallel": True}, "not with --sequence-parallel"),
                       ({"--tensor-model-parallel-size": 1}, "give --tensor-model-parallel-size 2"),
                       ({"--recompute-granularity": "selective"}, "--recompute-granularity full only")):
        with pytest.raises(UserError, match=f"^--distribute-saved-activations: Megatron-LM rejects the job: .*{why}"):
            convert_args(full | {"--distribute-saved-activations": True} | extra)

    def timeline_of(conv):
        text = run_file_text(conv, name="dist", source="<test>", world_size=2)
        return build_timeline(run_from_data(tomllib.loads(text), Path("<test>/dist.toml")))

    whole = 512 * 2 * 256 * 2  # seq 512 × micro-batch 2 × hidden 256, bf16: the hidden states entering a layer
    tl, plain = timeline_of(c), timeline_of(convert_args(full))
    ev = tl.events(0)
    names = np.array(tl.sim.names)[ev.tensor].astype(str)
    ops = np.array(tl.sim.names)[ev.op].astype(str)
    mb0 = ev.microbatch == 0

    def events(name: str) -> list[tuple[int, int, str]]:
        return [(int(ev.sign[i]), int(ev.size[i]), ops[i]) for i in np.flatnonzero(mb0 & (names == name))]

    # the embedding's output enters layer 0's checkpoint: released at the checkpoint's end, its chunk kept
    assert events("embedding.dropout.out")[:2] == [(1, whole, "embedding.dropout"),
                                                   (-1, whole, "checkpoint.full@0.distribute")]
    assert events("embedding.dropout.out.distributed@full@0")[:2] == [
        (1, whole // 2, "checkpoint.full@0.distribute"), (-1, whole // 2, "checkpoint.full@0.distribute.recompute")]
    gathered = events("embedding.dropout.out@recompute")
    assert gathered[0] == (1, whole, "checkpoint.full@0.distribute.recompute") and gathered[1][0] == -1
    # the gather comes before the chunk's release (the whole buffer, then the chunk's data replaced)
    at: dict[tuple[str, int], int] = {}
    for i in np.flatnonzero(mb0):
        at.setdefault((names[i], int(ev.sign[i])), int(i))
    assert at[("embedding.dropout.out@recompute", 1)] < at[("embedding.dropout.out.distributed@full@0", -1)]
    # pp 1: both peak at the first micro-batch's loss, with the four layers' stashes live, each half as large
    assert tl.peak_context(0)["action"] == plain.peak_context(0)["action"] == "0F0"
    assert plain.peak(0).allocated_bytes - tl.peak(0).allocated_bytes == 4 * (whole - whole // 2)


def test_probs_applied_on_the_experts_input_keep_the_weighted_copy():
    """--moe-apply-probs-on-input (experts.py, 4ca43093f8 on: Llama 4's top-1 routing): `permuted_probs *
    permuted_local_hidden_states` in the promoted dtype — fp32 under --moe-router-dtype fp32 — cast back to bf16,
    which fc1 keeps; the multiply keeps the permuted input and the probs; the activation gets ones."""
    import tomllib
    from pathlib import Path

    import numpy as np

    from timeline.io.megatron_write import run_file_text
    from timeline.io.runfile import run_from_data
    from timeline.result.build import build_timeline

    moe = BASE | {"--num-experts": 4, "--moe-router-topk": 1, "--moe-token-dispatcher-type": "alltoall",
                  "--moe-grouped-gemm": True, "--moe-router-dtype": "fp32"}
    c = convert_args(moe | {"--moe-apply-probs-on-input": True})
    assert c.sections["framework"]["moe_apply_probs_on_input"] is True
    with pytest.raises(UserError, match="^--moe-apply-probs-on-input with --moe-router-topk other than 1"):
        convert_args(moe | {"--moe-apply-probs-on-input": True, "--moe-router-topk": 2})

    def timeline_of(conv):
        text = run_file_text(conv, name="probs", source="<test>", world_size=2)
        return build_timeline(run_from_data(tomllib.loads(text), Path("<test>/probs.toml")))

    tl = timeline_of(c)
    ev = tl.events(0)
    names = np.array(tl.sim.names)[ev.tensor].astype(str)
    first_backward = min(s.start_us for s in tl.sim.spans[0] if s.kind in ("B", "I"))

    def life(name: str) -> tuple[float, float, int]:
        (made, size), (freed, _) = [(float(ev.t_us[i]), int(ev.size[i])) for i in np.flatnonzero(names == name)][:2]
        return made, freed, size

    rows = 2 * 512  # micro-batch 2 × 512 tokens, top-1, one rank's tokens
    made, freed, size = life("layers.0.mlp.experts.probs_on_input")
    assert size == rows * 256 * 4 and freed < first_backward  # the fp32 product: a forward transient
    made, freed, size = life("layers.0.mlp.experts.probs_on_input.cast")
    assert size == rows * 256 * 2 and made < first_backward <= freed  # the bf16 copy fc1 keeps
    plain = timeline_of(convert_args(moe))
    # at the same instant (the last micro-batch's loss), each of the four MoE layers holds the bf16 weighted copy and
    # the fp32 ones beyond the plain run (the input and the probs were kept anyway)
    assert tl.peak_context(0)["action"] == plain.peak_context(0)["action"]
    assert tl.peak(0).allocated_bytes - plain.peak(0).allocated_bytes == 4 * (rows * 256 * 2 + rows * 4)


def test_te_activation_modules_weigh_the_experts_output_as_torch_ops():
    """--use-te-activation-func (mlp.py / experts.py bias_act_func, core_v0.15.0 on): TE's SwiGLU keeps its input
    alone; the experts then multiply its output by the probs (fp32 under --moe-router-dtype fp32), keeping the
    output and the probs, and cast the product back for fc2 — one bf16 [rows, ffn] more per MoE layer than the
    fused weighted SwiGLU, which keeps its input and the probs."""
    import tomllib
    from pathlib import Path

    import numpy as np

    from timeline.io.megatron_write import run_file_text
    from timeline.io.runfile import run_from_data
    from timeline.result.build import build_timeline

    moe = BASE | {"--num-experts": 4, "--moe-router-topk": 2, "--moe-token-dispatcher-type": "alltoall",
                  "--moe-grouped-gemm": True, "--moe-router-dtype": "fp32", "--swiglu": True,
                  "--moe-ffn-hidden-size": 512}
    c = convert_args(moe | {"--use-te-activation-func": True})
    assert c.sections["framework"]["te_activation_func"] is True

    def timeline_of(conv):
        text = run_file_text(conv, name="teact", source="<test>", world_size=2)
        return build_timeline(run_from_data(tomllib.loads(text), Path("<test>/teact.toml")))

    tl, plain = timeline_of(c), timeline_of(convert_args(moe))
    ev = tl.events(0)
    names = np.array(tl.sim.names)[ev.tensor].astype(str)
    first_backward = min(s.start_us for s in tl.sim.spans[0] if s.kind in ("B", "I"))
    rows = 2 * 512 * 2  # micro-batch 2 × 512 tokens × top-2

    def life(name: str) -> tuple[float, float, int]:
        (made, size), (freed, _) = [(float(ev.t_us[i]), int(ev.size[i])) for i in np.flatnonzero(names == name)][:2]
        return made, freed, size

    for name, size, kept in (("layers.0.mlp.experts.act.out", rows * 512 * 2, True),
                             ("layers.0.mlp.experts.act.weighted", rows * 512 * 4, False),
                             ("layers.0.mlp.experts.act.weighted.cast", rows * 512 * 2, True)):
        made, freed, got = life(name)
        assert got == size and (made < first_backward <= freed) == kept, name
    assert tl.peak_context(0)["action"] == plain.peak_context(0)["action"]
    # requested bytes (the allocator's block rounding aside): the four MoE layers' activation outputs
    assert tl.peak(0).requested_bytes - plain.peak(0).requested_bytes == 4 * rows * 512 * 2


def test_te_activation_modules_come_before_the_unfused_swiglu():
    """mlp.py: use_te_activation_func is tested before bias_activation_fusion, so --no-bias-swiglu-fusion's torch-op
    SwiGLU (which keeps silu's output) does not run: TE's module keeps the fc1 output alone."""
    import tomllib
    from pathlib import Path

    import numpy as np

    from timeline.io.megatron_write import run_file_text
    from timeline.io.runfile import run_from_data
    from timeline.result.build import build_timeline

    dense = BASE | {"--swiglu": True, "--no-bias-swiglu-fusion": True}

    def kept_names(conv) -> set[str]:
        tl = build_timeline(run_from_data(tomllib.loads(run_file_text(conv, name="d", source="<t>", world_size=2)),
                                          Path("<t>/d.toml")))
        ev = tl.events(0)
        return set(np.array(tl.sim.names)[ev.tensor].astype(str))

    assert "layers.0.mlp.act.silu" in kept_names(convert_args(dense))
    assert "layers.0.mlp.act.silu" not in kept_names(convert_args(dense | {"--use-te-activation-func": True}))


def test_qk_l2_norm_keeps_what_a_per_head_norm_keeps_without_weights():
    """--qk-l2-norm (gpt_layer_specs.py: torch_norm.py L2Norm for q and k, compiled by jit_fuser): its backward keeps
    the input and one fp32 rsqrt per row and head — the bytes a per-head TE RMSNorm keeps — and it has no weight."""
    import tomllib
    from pathlib import Path

    from timeline.io.megatron_write import run_file_text
    from timeline.io.runfile import run_from_data
    from timeline.result.build import build_timeline

    c = convert_args(BASE | {"--qk-l2-norm": True})
    assert (c.sections["model"]["qk_norm"], c.sections["framework"]["qk_l2_norm"]) == (True, True)
    with pytest.raises(UserError, match="^--qk-l2-norm with --multi-latent-attention: Megatron-LM rejects it"):
        convert_args(BASE | {"--qk-l2-norm": True, "--multi-latent-attention": True})

    def timeline_of(conv):
        text = run_file_text(conv, name="l2", source="<test>", world_size=2)
        return build_timeline(run_from_data(tomllib.loads(text), Path("<test>/l2.toml")))

    # against TE's per-head RMSNorm (a LayerNorm would keep its mean too)
    rms = BASE | {"--normalization": "RMSNorm"}
    l2, ln = timeline_of(convert_args(rms | {"--qk-l2-norm": True})), timeline_of(convert_args(rms | {"--qk-layernorm": True}))
    assert not any("q_norm.weight" in n for n in l2.sim.names) and any("q_norm.weight" in n for n in ln.sim.names)
    import numpy as np

    def kept(tl, name: str) -> int:
        ev = tl.events(0)
        names = np.array(tl.sim.names)[ev.tensor].astype(str)
        return int(ev.size[np.flatnonzero(names == name)[0]])

    rows_heads = 2 * 512 * 8  # micro-batch 2 × 512 tokens × 8 heads (tp 1, dp 2): one fp32 rsqrt each
    assert kept(l2, "layers.0.self_attn.q_norm.rsigma") == kept(ln, "layers.0.self_attn.q_norm.rsigma") \
        == rows_heads * 4
    assert l2.peak(0).breakdown_bytes["activations"] == ln.peak(0).breakdown_bytes["activations"]
    assert l2.peak(0).breakdown_bytes["weights"] < ln.peak(0).breakdown_bytes["weights"]
