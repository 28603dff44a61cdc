"""What the recorder sees: layer boundaries, per-layer op attribution, saved bytes, clear errors."""

from __future__ import annotations

import pytest

torch = pytest.importorskip("torch")
pytest.importorskip("transformers")

from captures import DSV3, LLAMA, B, S  # noqa: E402

from timeline.capture.hf import hf_builder  # noqa: E402
from timeline.capture.run import capture, load_factory  # noqa: E402
from timeline.errors import UserError  # noqa: E402


@pytest.fixture(scope="module")
def llama():
    return capture(hf_builder(LLAMA, micro_batch_size=B, seq_len=S))


def test_layers_and_boundaries(llama):
    assert [ly.index for ly in llama.layers] == [0, 1]
    l0, l1 = llama.layers
    assert l1.hidden_in == l0.hidden_out and l0.grad_in >= 0 and l1.grad_in == l0.grad_out


def test_backward_ops_belong_to_the_right_layer(llama):
    """Autograd-node labels give each layer the same backward op sequence (ModTracker alone drifts)."""
    seq = {c: [o.name for o in llama.ops if o.phase == "B" and o.layer == c] for c in (0, 1)}
    assert seq[0] == seq[1] and len(seq[0]) > 50
    fwd = {c: [o.name for o in llama.ops if o.phase == "F" and o.layer == c] for c in (0, 1)}
    assert fwd[0] == fwd[1]


def test_saved_bytes_match_the_hf_llama_closed_form(llama):
    """groundtruth.md §5: s·b·(24h + 8I) + 4·a·s·b + 8·s·b, k and v at kv-head width (native GQA
    flash), + 24 B of flash RNG state."""
    h, i, a, kv, sb = 256, 704, 4, 2, B * S
    expected = sb * (24 * h + 8 * i) + 4 * a * sb + 8 * sb - 2 * 2 * sb * h * (1 - kv / a) + 24
    layer_of = {s: o.layer for o in llama.ops for s in o.allocs}
    saved = [st for st in llama.storages.values() if st.saved and st.free_op >= 0 and layer_of.get(st.id) == 1]
    assert sum(st.nbytes for st in saved) == expected


def test_gpu_kernels_not_cpu_fallbacks(llama):
    names = {o.name for o in llama.ops}
    assert "aten._scaled_dot_product_flash_attention.default" in names
    assert not any("_scaled_dot_product_flash_attention_for_cpu" in n or "math" in n for n in names)


def test_flops_recorded(llama):
    mm = [o for o in llama.ops if o.name == "aten.mm.default"]
    assert mm and all(o.flops > 0 for o in mm)


def test_eager_experts_fail_with_a_clear_message():
    with pytest.raises(UserError, match=r"aten\.nonzero.*grouped_mm"):
        capture(hf_builder({**DSV3, "experts_implementation": "eager"}, micro_batch_size=1, seq_len=16))


def test_module_factory_capture():
    trace = capture(load_factory("captures:tiny_factory"))
    assert len(trace.layers) == 2 and any(o.phase == "B" for o in trace.ops)


def test_module_without_layers_is_a_clear_error():
    with pytest.raises(UserError, match="no decoder layers found"):
        capture(load_factory("captures:flat_factory"))


def test_bad_factory_spec(tmp_path):
    with pytest.raises(UserError, match="expected MODULE:NAME"):
        load_factory("nocolon")
    with pytest.raises(UserError, match="no such file"):
        load_factory(f"{tmp_path}/missing.py:build")
    # a path to a .py file works as --step's does
    (tmp_path / "fac.py").write_text("import torch\n"
                                     "def build():\n    return torch.nn.Linear(2, 2), (torch.ones(1, 2),)\n")
    model, args, kwargs = load_factory(f"{tmp_path}/fac.py:build")()
    assert isinstance(model, torch.nn.Linear) and args[0].shape == (1, 2) and kwargs == {}
