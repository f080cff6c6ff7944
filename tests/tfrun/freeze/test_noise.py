"""tfrun.freeze.noise: the two-batch noise-scale estimator against the closed form of a problem whose gradient
covariance is known, and data parallelism against one process on the same data."""

from __future__ import annotations

import pytest

torch = pytest.importorskip("torch")

from tfrun.freeze.candidates import Candidate  # noqa: E402
from tfrun.freeze.noise import NoiseMeter, noise_scale  # noqa: E402

D, SIGMA = 16, 1.0
"""Linear regression in D dimensions: x ~ N(0, I), y = w*.x + N(0, SIGMA^2), loss 0.5 (w.x - y)^2 per token."""


def closed_form(delta_sq: float) -> float:
    """At w = w* + delta: G = delta, tr(Sigma) = E[(delta.x - e)^2 |x|^2] - |delta|^2 = |delta|^2 (D + 1) +
    SIGMA^2 D (Gaussian fourth moments), so B_noise = D + 1 + SIGMA^2 D / |delta|^2 tokens."""
    return D + 1 + SIGMA ** 2 * D / delta_sq


class Linear(torch.nn.Module):
    def __init__(self, delta: torch.Tensor) -> None:
        super().__init__()
        self.w = torch.nn.Parameter(delta.clone())  # w* = 0: the parameter is its own distance from the optimum


def _microbatch(gen: torch.Generator, tokens: int) -> tuple[torch.Tensor, torch.Tensor]:
    x = torch.randn(tokens, D, generator=gen, dtype=torch.float64)
    return x, SIGMA * torch.randn(tokens, generator=gen, dtype=torch.float64)


def _measure(steps: int, m: int, tokens: int, seed: int, dp: int = 1, dp_rank: int = 0, group=None):
    """Steps at a fixed point, as the pipeline runs them: one backward per micro-batch into .grad, scaled by
    1 / M, averaged over the replicas; every replica takes its share of each micro-batch's tokens."""
    delta = torch.full((D,), 0.5, dtype=torch.float64)
    module = Linear(delta)
    meter = NoiseMeter({0: module}, {0: [Candidate(name="w", cost=1.0)]}, num_microbatches=m,
                       microbatch_tokens=tokens // dp, every=1, dp=dp, dp_group=group)
    gen = torch.Generator().manual_seed(seed)
    for step in range(steps):
        meter.begin_step(step)
        module.w.grad = None
        for _ in range(m):
            x, e = _microbatch(gen, tokens)
            part = slice(dp_rank * tokens // dp, (dp_rank + 1) * tokens // dp)
            residual = x[part] @ module.w - e[part]
            (0.5 * residual.square().mean()).backward()
        module.w.grad /= m
        if dp > 1:
            torch.distributed.all_reduce(module.w.grad, group=group)
            module.w.grad /= dp
        assert meter.after_reduce({0: module})
    gsq, trace = meter.stage_estimates()[0]
    return noise_scale(gsq, trace), float(delta.square().sum())


def test_the_estimate_matches_the_closed_form_within_ten_percent():
    # |delta|^2 = 4: B_noise = 17 + 4 = 21 tokens, measured with micro-batches of 8 tokens (below it) and steps of
    # 64 of them (512, far above); 300 steps, each estimate averaged (factor 0.9) before the ratio
    estimate, delta_sq = _measure(steps=300, m=64, tokens=8, seed=0)
    assert closed_form(delta_sq) == pytest.approx(21.0)
    assert estimate == pytest.approx(closed_form(delta_sq), rel=0.10)


def test_a_tensor_reached_by_one_microbatch_gives_no_estimate():
    module = Linear(torch.ones(D, dtype=torch.float64))
    meter = NoiseMeter({0: module}, {0: [Candidate(name="w", cost=1.0)]}, num_microbatches=1, microbatch_tokens=4,
                       every=2)
    meter.begin_step(1)  # not a measured step: hooks do nothing, nothing is folded in
    assert not meter.after_reduce({0: module}) and meter.stage_estimates() == {}
    meter.begin_step(2)
    x, e = _microbatch(torch.Generator().manual_seed(0), 4)
    (0.5 * (x @ module.w - e).square().mean()).backward()
    assert meter.after_reduce({0: module}) and meter.stage_estimates() == {}  # a stage with no estimate: left out
    assert meter.skipped == [0] and meter.gathered() == ({}, [0])  # and said so (metrics' noise_skipped)
    assert noise_scale(0.0, 0.0) is None


def _dp_worker(rank: int, path: str, out: str) -> None:
    torch.distributed.init_process_group("gloo", rank=rank, world_size=2, init_method=f"file://{path}")
    try:
        estimate, _ = _measure(steps=100, m=16, tokens=16, seed=1, dp=2, dp_rank=rank)
        torch.save(estimate, f"{out}.{rank}")
    finally:
        torch.distributed.destroy_process_group()


@pytest.mark.slow  # two gloo processes: the quick tier has no multi-process jobs (README)
def test_two_replicas_agree_with_one_process_on_the_same_data(tmp_path):
    # The same micro-batches (16 tokens), split in two halves of 8 tokens over two replicas: the replicas'
    # small gradients are of 8 tokens and their mean is the one process's; the estimates agree within 10%.
    one, _ = _measure(steps=100, m=16, tokens=16, seed=1)
    torch.multiprocessing.spawn(_dp_worker, args=(str(tmp_path / "pg"), str(tmp_path / "est")), nprocs=2)
    two = [torch.load(f"{tmp_path / 'est'}.{r}") for r in (0, 1)]
    assert two[0] == two[1]  # every replica holds the same estimate
    assert two[0] == pytest.approx(one, rel=0.10)
