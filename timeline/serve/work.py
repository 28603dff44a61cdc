"""A lower bound on a serving run's engine steps, checked before any work (like ``--max-events`` for
training): every step schedules at most ``max_num_batched_tokens`` tokens and at most
``max_num_seqs`` decodes, and a request needs at least one step per output token. A synthetic load
is bounded from its distributions' means before a single request is drawn."""

from __future__ import annotations

from timeline.errors import UserError
from timeline.spec.serving import DistSpec, ServeRunSpec

#: about 7 minutes at the ~1,200 steps a second a Llama-3.1-8B load runs on one core (tools/bench_serve.py)
DEFAULT_MAX_STEPS = 500_000


def _mean(d: DistSpec) -> float:
    return {"fixed": d.value, "uniform": (d.min + d.max) / 2, "lognormal": d.mean}[d.dist]


def min_steps(run: ServeRunSpec) -> int:
    sv = run.serving
    tokens: float
    outputs: float
    longest: float
    if run.requests:
        tokens = sum(r.prompt_tokens + r.output_tokens for r in run.requests)
        outputs = sum(r.output_tokens for r in run.requests)
        longest = max(r.output_tokens for r in run.requests)
    else:
        assert run.load is not None  # validation gives a run requests or a load
        n = run.load.num_requests
        outputs = n * _mean(run.load.output_tokens)
        tokens = n * _mean(run.load.prompt_tokens) + outputs
        longest = _mean(run.load.output_tokens)
    seqs = 1 if sv.engine == "hf" else sv.max_num_seqs  # hf: batches run one after another
    return int(max(longest, tokens / sv.max_num_batched_tokens, outputs / seqs))


def check_steps(run: ServeRunSpec, max_steps: int) -> None:
    """A one-line UserError when the run needs more than ``max_steps`` engine steps."""
    steps = min_steps(run)
    if steps > max_steps:
        raise UserError(f"this load needs at least {steps:,} engine steps, over --max-steps {max_steps:,}; "
                        "use fewer or shorter requests, or raise --max-steps if you can wait")
