"""Serving: an inference engine's memory budget and its continuous-batching timeline (DESIGN §12).

Layer: after ``result``, beside ``compare`` (``result → (compare, plan, serve) → exporters → cli``).
The budget (:mod:`.budget`) is computed as each engine computes it, every rule citing the engine's
source; the timeline (:mod:`.run`) drives the vLLM-V1-style scheduler of
:mod:`timeline.sim.batching` (simpy stays in ``sim``) and puts each eager step's transients through
the allocator model. Nothing here reads files or prints.
"""
