"""Measure Hugging Face ``generate`` on the CPU: per step, the DynamicCache bytes and the peak of live
tensor bytes (a storage-tracking dispatch mode: every storage an aten op creates is counted from its
creation until it is freed, weights excluded), next to what ``engine = "hf"`` predicts for the cache
(``timeline.serve.hf``). The difference is the step's own activations, which the hf engine does not
model yet. Run on purpose (extra ``capture``)::

    python tools/measure_hf_generate.py llama --batch 3 --prompt 10 --new 4

Prints one JSON line per step. Importing this module imports neither torch nor transformers.
"""

from __future__ import annotations

import argparse
import json
import sys
import tempfile
import weakref
from pathlib import Path

SMALL = {
    "llama": dict(hidden_size=64, intermediate_size=128, num_hidden_layers=2, num_attention_heads=4,
                  num_key_value_heads=2, vocab_size=256),
    "qwen3": dict(hidden_size=64, intermediate_size=128, num_hidden_layers=2, num_attention_heads=4,
                  num_key_value_heads=2, head_dim=16, vocab_size=256),
    "deepseek_v3": dict(hidden_size=64, intermediate_size=128, moe_intermediate_size=32, num_hidden_layers=2,
                        num_attention_heads=4, num_key_value_heads=4, vocab_size=256, kv_lora_rank=16,
                        q_lora_rank=24, qk_rope_head_dim=8, qk_nope_head_dim=16, v_head_dim=16, n_routed_experts=4,
                        num_experts_per_tok=2, first_k_dense_replace=1, n_group=1, topk_group=1),
}


def measure(family: str, batch: int, prompt: int, new: int) -> list[dict]:
    import torch
    import transformers
    from torch.utils._python_dispatch import TorchDispatchMode

    sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
    from timeline.io.hf_config import read_hf_config
    from timeline.serve.hf import hf_cache_bytes, hf_cache_peak_bytes

    cfg = transformers.AutoConfig.for_model(family, **SMALL[family])
    torch.manual_seed(0)
    model = transformers.AutoModelForCausalLM.from_config(cfg, dtype=torch.bfloat16).eval()
    with tempfile.TemporaryDirectory() as tmp:
        path = Path(tmp) / "config.json"
        path.write_text(json.dumps(cfg.to_dict()))
        spec = read_hf_config(path)
    state = {"live": 0, "peak": 0}
    seen: set[int] = set()

    def track(t: torch.Tensor) -> None:
        st = t.untyped_storage()
        key = st._cdata
        if key in seen or st.nbytes() == 0:
            return
        seen.add(key)
        state["live"] += st.nbytes()
        state["peak"] = max(state["peak"], state["live"])
        size = st.nbytes()

        def gone(key=key, size=size) -> None:
            seen.discard(key)
            state["live"] -= size

        weakref.finalize(st, gone)

    class Live(TorchDispatchMode):
        def __torch_dispatch__(self, func, types, args=(), kwargs=None):
            out = func(*args, **(kwargs or {}))
            for t in out if isinstance(out, (tuple, list)) else (out,):
                if isinstance(t, torch.Tensor):
                    track(t)
            return out

    rows: list[dict] = []

    class Step(transformers.LogitsProcessor):  # called once per generate step, after its forward
        def __call__(self, input_ids, scores):
            n = len(rows) + 1
            rows.append({"step": n, "peak_live_bytes": state["peak"], "live_bytes": state["live"],
                         "model_cache_bytes": hf_cache_bytes(spec, "bf16", batch, prompt + n - 1),
                         "model_cache_peak_bytes": hf_cache_bytes(spec, "bf16", batch, prompt) if n == 1
                         else hf_cache_peak_bytes(spec, "bf16", batch, prompt + n - 1)})
            state["peak"] = state["live"]
            return scores

    ids = torch.randint(1, cfg.vocab_size, (batch, prompt))
    with torch.inference_mode(), Live():
        model.generate(ids, max_new_tokens=new, min_new_tokens=new, do_sample=False, pad_token_id=0,
                       logits_processor=transformers.LogitsProcessorList([Step()]))
    return rows


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("family", choices=sorted(SMALL))
    p.add_argument("--batch", type=int, default=3)
    p.add_argument("--prompt", type=int, default=10)
    p.add_argument("--new", type=int, default=4)
    a = p.parse_args(argv)
    for row in measure(a.family, a.batch, a.prompt, a.new):
        print(json.dumps(row))
    return 0


if __name__ == "__main__":
    sys.exit(main())
