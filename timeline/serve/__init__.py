"""Serving: an inference engine's memory budget and its continuous-batching timeline (DESIGN §12).

Layer: after ``result``, beside ``compare`` (``result → (compare, plan, serve) → exporters → cli``).
The budget (:mod:`.budget`) is computed as each engine computes it, every rule citing the engine's
source (:mod:`.rules`); the timeline (:mod:`.scheduler`) runs a vLLM-V1-style token-budget
scheduler in simpy. Nothing here reads files or prints.
"""
