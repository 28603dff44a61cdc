"""The seeded synthetic load: deterministic, Poisson arrivals at the rate, distributions as declared."""

from __future__ import annotations

from dataclasses import replace

import numpy as np

from timeline.serve.requests import synthetic_requests
from timeline.spec.serving import DistSpec, LoadSpec


def test_same_seed_same_requests_and_other_seed_other_requests():
    load = LoadSpec(num_requests=50, rate_per_s=4.0, prompt_tokens=DistSpec(dist="uniform", min=10, max=20),
                    output_tokens=DistSpec(dist="lognormal", mean=100, sigma=0.5), seed=7)
    a, b = synthetic_requests(load), synthetic_requests(load)
    assert a == b
    assert synthetic_requests(replace(load, seed=8)) != a


def test_distributions_and_arrivals():
    n = 20_000
    load = LoadSpec(num_requests=n, rate_per_s=10.0, prompt_tokens=DistSpec(dist="uniform", min=5, max=9),
                    output_tokens=DistSpec(dist="lognormal", mean=200, sigma=0.4), seed=0)
    reqs = synthetic_requests(load)
    arrivals = np.array([r.arrival_us for r in reqs])
    assert arrivals[0] == 0 and np.all(np.diff(arrivals) >= 0)
    assert abs(arrivals[-1] / (n - 1) - 1e5) < 0.03 * 1e5  # mean gap 1 / rate = 100 ms
    prompts = np.array([r.prompt_tokens for r in reqs])
    assert prompts.min() == 5 and prompts.max() == 9
    outputs = np.array([r.output_tokens for r in reqs])
    assert abs(outputs.mean() - 200) < 0.03 * 200  # the mean is the declared mean, not exp(mu)
    fixed = synthetic_requests(LoadSpec(num_requests=3, prompt_tokens=DistSpec(value=17)))
    assert [r.prompt_tokens for r in fixed] == [17, 17, 17] and [r.rid for r in fixed] == [0, 1, 2]
