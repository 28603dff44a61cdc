"""A seeded synthetic load (``[serving.load]``): Poisson arrivals and token-count distributions.

numpy's PCG64 generator seeded by ``seed`` draws, in order, the inter-arrival gaps
(exponential, mean ``1e6 / rate_per_s`` µs), the prompt lengths and the output lengths, so the
same seed gives the same requests on every machine. ``lognormal`` takes the *mean* token count
(what users know) and sigma of log-tokens: ``mu = ln(mean) − sigma²/2``. Counts are rounded and
clipped to ≥ 1.
"""

from __future__ import annotations

import math

import numpy as np

from timeline.spec.serving import DistSpec, LoadSpec, Request


def _draw(rng: np.random.Generator, d: DistSpec, n: int) -> np.ndarray:
    if d.dist == "fixed":
        return np.full(n, d.value, dtype=np.int64)
    if d.dist == "uniform":
        return rng.integers(d.min, d.max + 1, size=n, dtype=np.int64)
    mu = math.log(d.mean) - d.sigma**2 / 2
    return np.maximum(1, np.rint(rng.lognormal(mu, d.sigma, size=n))).astype(np.int64)


def synthetic_requests(load: LoadSpec, max_tokens: int = 2**26) -> tuple[Request, ...]:
    rng = np.random.Generator(np.random.PCG64(load.seed))
    n = load.num_requests
    gaps = rng.exponential(1e6 / load.rate_per_s, size=n)
    arrivals = np.cumsum(gaps) - gaps[0]  # the first request arrives at 0
    prompts = np.minimum(_draw(rng, load.prompt_tokens, n), max_tokens)
    outputs = np.minimum(_draw(rng, load.output_tokens, n), max_tokens)
    return tuple(Request(rid=i, arrival_us=float(round(arrivals[i], 3)), prompt_tokens=int(prompts[i]),
                         output_tokens=int(outputs[i])) for i in range(n))
