"""The rotary embeddings' persistent tables of a Megatron job (``profiles/megatron_workspaces.py: rotary_caches``).

``RotaryEmbedding.forward`` and ``YarnRotaryEmbedding.forward`` are ``lru_cache(maxsize=32)`` methods whose fp32
``[s/cp, 1, 1, d]`` result stays referenced; a GPT model holds one per model chunk, an MLA layer one of its own.
An MLA layer's YaRN embedding also registers cos/sin buffers: from Megatron-Core 0.13 (23e6471569) over
``original_max_position_embeddings`` in fp32 at construction, re-registered over the training sequence in the
activations' dtype under RoPE fusion; before 0.16 (5153663876) the construction's ``forward`` entry stays cached.
"""

from __future__ import annotations

from dataclasses import dataclass, replace

import pytest

from timeline.errors import UserError
from timeline.io.megatron_args import from_mapping
from timeline.io.megatron_write import convert
from timeline.profiles.megatron_workspaces import rotary_caches
from timeline.spec.framework import FrameworkSpec
from timeline.spec.model import ModelSpec
from timeline.spec.presets import PRESETS
from timeline.spec.run import ParallelSpec, TrainingSpec


@dataclass(frozen=True)
class Param:
    name: str
    shape: tuple[int, ...] = (1, 1)
    trainable: bool = True
    expert: bool = False


MLA: ModelSpec = replace(PRESETS["deepseek-v3"], qk_rope_head_dim=64)
LLAMA: ModelSpec = PRESETS["llama3-8b"]
TRAIN = TrainingSpec(seq_len=2048, micro_batch_size=1)
TABLE = 2048 * 64 * 4  # one fp32 [2048, 64] table


def layers(n: int) -> list[Param]:
    return [Param(f"layers.{i}.self_attn.kv_a_proj.rope.weight") for i in range(n)]


def total(fw: FrameworkSpec, m: ModelSpec = MLA, par: ParallelSpec | None = None, n: int = 4,
          tr: TrainingSpec = TRAIN) -> dict[str, int]:
    return {name: size for name, size, _ in rotary_caches(fw, m, tr, par or ParallelSpec(), layers(n))}


@pytest.mark.parametrize(("core", "fusion", "expected"), [
    # 0.12: the training call's table alone
    ("0.12.0", True, {"workspace.yarn_rotary_pos_emb": 4 * TABLE}),
    # 0.13 … 0.15 without fusion: fp32 cos/sin over 4,096 positions, the construction's entry and the training one
    ("0.15.0", False, {"workspace.yarn_cos_sin": 4 * 2 * 2 * TABLE, "workspace.yarn_rotary_pos_emb": 4 * (TABLE + 2 * TABLE)}),
    # 0.13 … 0.15 with fusion: bf16 cos/sin over the 2,048 training positions; both entries (2,048 ≠ 4,096)
    ("0.14.0", True, {"workspace.yarn_cos_sin": 4 * 2 * TABLE // 2, "workspace.yarn_rotary_pos_emb": 4 * 3 * TABLE}),
    # 0.16 on: the construction's entry cleared
    ("0.16.0", False, {"workspace.yarn_cos_sin": 4 * 2 * 2 * TABLE, "workspace.yarn_rotary_pos_emb": 4 * TABLE}),
    ("0.19.0", True, {"workspace.yarn_cos_sin": 4 * 2 * TABLE // 2, "workspace.yarn_rotary_pos_emb": 4 * TABLE}),
])
def test_an_mla_layer_s_yarn_tables_by_release(core, fusion, expected):
    assert total(FrameworkSpec(megatron_core=core, rope_fusion=fusion)) == expected


def test_one_entry_when_the_training_sequence_is_the_constructed_one():
    """Before 0.16 the fused path's forward(s, 0) is the construction's own call when s = 4,096: one entry."""
    tr = replace(TRAIN, seq_len=4096)
    got = total(FrameworkSpec(megatron_core="0.15.0", rope_fusion=True), tr=tr)
    assert got["workspace.yarn_rotary_pos_emb"] == 4 * 2 * TABLE


def test_the_lru_cache_keeps_32_entries_the_training_ones_first():
    got = total(FrameworkSpec(megatron_core="0.15.0", rope_fusion=False), n=20)
    assert got["workspace.yarn_rotary_pos_emb"] == 20 * TABLE + 12 * 2 * TABLE
    assert total(FrameworkSpec(megatron_core="0.16.0", rope_fusion=False), n=40)[
        "workspace.yarn_rotary_pos_emb"] == 32 * TABLE


def test_context_parallelism_slices_every_table():
    got = total(FrameworkSpec(megatron_core="0.16.0", rope_fusion=False), par=ParallelSpec(cp=2))
    assert got == {"workspace.yarn_cos_sin": 4 * 2 * TABLE, "workspace.yarn_rotary_pos_emb": 4 * TABLE // 2}


def test_mla_with_plain_rope_and_a_gpt_model_hold_one_table_each():
    assert total(FrameworkSpec(mla_rope_type="rope")) == {"workspace.rotary_pos_emb": 4 * TABLE}
    # Llama-3-8B: head dim 128, one table per model chunk
    got = total(FrameworkSpec(), m=LLAMA, par=ParallelSpec(pp=2, vpp=2), n=0)
    assert got == {"workspace.rotary_pos_emb": 2 * 2048 * 128 * 4}
    half = total(FrameworkSpec(), m=replace(LLAMA, partial_rotary_factor=0.5), n=0)
    assert half == {"workspace.rotary_pos_emb": 2048 * 64 * 4}
    assert total(FrameworkSpec(), m=replace(LLAMA, position_embedding="learned"), n=0) == {}


def test_a_gpt_level_yarn_embedding_keeps_its_construction_tables():
    """--position-embedding-type yarn (gpt_model.py, 2c1b77a998 on): one YarnRotaryEmbedding per model chunk —
    fp32 cos/sin over the original 4,096 positions and the training table (no fused path at the model level)."""
    llama = TABLE * 2  # head dim 128: one fp32 [2048, 128] table
    got = total(FrameworkSpec(megatron_core="0.16.0", yarn_positions=True), m=LLAMA, n=0)
    assert got == {"workspace.yarn_cos_sin": 2 * 2 * llama, "workspace.yarn_rotary_pos_emb": llama}
    got = total(FrameworkSpec(megatron_core="0.15.0", yarn_positions=True), m=LLAMA, n=0)
    assert got["workspace.yarn_rotary_pos_emb"] == llama + 2 * llama  # the construction's entry, not cleared


def test_from_megatron_maps_what_sizes_them():
    base = {"--num-layers": 2, "--hidden-size": 256, "--num-attention-heads": 8, "--seq-length": 512,
            "--max-position-embeddings": 512, "--micro-batch-size": 1, "--global-batch-size": 8, "--bf16": True,
            "--vocab-size": 1000, "--position-embedding-type": "rope"}
    c = convert(from_mapping(base | {"--rotary-percent": 0.5, "--no-rope-fusion": True}), world_size=1)
    # without MLA layers the fusion sizes nothing: not written
    assert c.sections["model"]["partial_rotary_factor"] == 0.5 and "rope_fusion" not in c.sections["framework"]
    mla = base | {"--multi-latent-attention": True, "--rope-type": "rope", "--original-max-position-embeddings": 8192}
    fw = convert(from_mapping(mla), world_size=1).sections["framework"]
    assert (fw["mla_rope_type"], fw["yarn_original_max_positions"]) == ("rope", 8192) and "rope_fusion" not in fw
    # arguments.py: validate_args turns the fusion off unless the position embedding is rope
    learned = mla | {"--position-embedding-type": "learned_absolute"}
    assert convert(from_mapping(learned), world_size=1).sections["framework"]["rope_fusion"] is False
    yarn = base | {"--position-embedding-type": "yarn", "--yarn-original-max-position-embeddings": 8192}
    fw = convert(from_mapping(yarn), world_size=1).sections["framework"]
    assert (fw["yarn_positions"], fw["yarn_original_max_positions"]) == (True, 8192)
    with pytest.raises(UserError, match="^--rope-type yarn without --multi-latent-attention: Megatron-LM rejects"):
        convert(from_mapping(base | {"--rope-type": "yarn"}), world_size=1)
