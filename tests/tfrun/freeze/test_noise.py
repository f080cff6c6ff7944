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


def _measure(steps: int, m: int, tokens: int, seed: int, dp: int = 1, dp_rank: int = 0, group=None,
             shadows: frozenset[int] = frozenset()):
    """Steps at a fixed point, as the pipeline runs them: one backward per micro-batch into .grad, scaled by
    1 / M, averaged over the replicas; every replica takes its share of each micro-batch's tokens. `shadows`: the
    micro-batches whose gradient is a shadow (Note [shadow gradients]), counted but kept out of .grad."""
    delta = torch.full((D,), 0.5, dtype=torch.float64)
    module = Linear(delta)
    meter = NoiseMeter({0: module}, {0: [Candidate(name="w", cost=1.0)]}, num_microbatches=m,
                       microbatch_tokens=tokens // dp, every=1, dp=dp, dp_group=group)
    current = [0]
    meter.microbatch_of[0] = lambda: current[0]
    meter.shadow = lambda step, stage, mb: frozenset({"w"}) if mb in shadows else frozenset()
    gen = torch.Generator().manual_seed(seed)
    for step in range(steps):
        meter.begin_step(step)
        module.w.grad = None
        for current[0] in range(m):
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


class Pair(torch.nn.Module):
    """Two tensors on one token: loss 0.5 ((w + u).x - y)^2."""

    def __init__(self) -> None:
        super().__init__()
        self.w = torch.nn.Parameter(torch.full((D,), 0.5, dtype=torch.float64))
        self.u = torch.nn.Parameter(torch.full((D,), -0.25, dtype=torch.float64))


# The plan freezes w in micro-batches 0 and 2 and u in all four; the measured block is {0, 1}, where every gradient
# is computed: w's in 0 and u's in 0 and 1 are shadows (Note [shadow gradients]).
PLAN_FROZEN = {0: {"w", "u"}, 1: {"u"}, 2: {"w", "u"}, 3: {"u"}}
MEASURED = (0, 1)


def _shadow_step(mode: str) -> tuple[Pair, NoiseMeter]:
    """One step of M = 4 micro-batches: `plan` backpropagates into what the plan leaves unfrozen only; `measured`
    also computes every gradient in the measured block (into .grad, the meter without shadows); `shadowed` the
    same with the meter told the plan's choice there."""
    module, m = Pair(), 4
    meter = NoiseMeter({0: module}, {0: [Candidate(name="w", cost=1.0), Candidate(name="u", cost=1.0)]},
                       num_microbatches=m, microbatch_tokens=8, every=1, measure="microbatch")
    current = {"mb": None}
    if mode == "shadowed":
        meter.microbatch_of[0] = lambda: current["mb"]
        meter.shadow = lambda step, stage, mb: frozenset(PLAN_FROZEN[mb]) if mb in MEASURED else frozenset()
    meter.begin_step(0)
    gen = torch.Generator().manual_seed(3)
    for mb in range(m):
        current["mb"] = mb
        x, e = _microbatch(gen, 8)
        loss = 0.5 * ((x @ (module.w + module.u) - e).square().mean())
        frozen = set() if mode != "plan" and mb in MEASURED else PLAN_FROZEN[mb]
        inputs = [p for name, p in module.named_parameters() if name not in frozen]
        if inputs:
            torch.autograd.backward(loss, inputs=inputs)
    for p in module.parameters():
        if p.grad is not None:
            p.grad /= m
    meter.after_reduce({0: module})
    return module, meter


def test_shadow_gradients_count_for_the_noise_scale_and_leave_the_plans_update():
    plan, _ = _shadow_step("plan")
    measured, plain = _shadow_step("measured")
    shadowed, meter = _shadow_step("shadowed")
    # the update: exactly the plan's, and u (reached by shadows only) has no gradient, as under the plan
    assert torch.equal(shadowed.w.grad, plan.w.grad) and shadowed.u.grad is None and plan.u.grad is None
    assert not torch.equal(measured.w.grad, plan.w.grad) and measured.u.grad is not None  # (what shadows avoid)
    # the noise scale: the measured step's, from the same micro-batches (two reached u, three reached w)
    for got, want in zip(meter.raw[0], plain.raw[0]):
        assert torch.allclose(got, want, rtol=1e-12, atol=0)
    assert meter.raw[0][2].tolist() == [True, True]


def _dp_worker(rank: int, path: str, out: str) -> None:
    torch.distributed.init_process_group("gloo", rank=rank, world_size=2, init_method=f"file://{path}")
    try:
        estimate, _ = _measure(steps=100, m=16, tokens=16, seed=1, dp=2, dp_rank=rank)
        shadowed, _ = _measure(steps=100, m=16, tokens=16, seed=1, dp=2, dp_rank=rank, shadows=frozenset({0, 5}))
        torch.save((estimate, shadowed), f"{out}.{rank}")
    finally:
        torch.distributed.destroy_process_group()


@pytest.mark.slow  # two gloo processes: the quick tier has no multi-process jobs (README)
def test_two_replicas_agree_with_one_process_on_the_same_data(tmp_path):
    # The same micro-batches (16 tokens), split in two halves of 8 tokens over two replicas: the replicas'
    # small gradients are of 8 tokens and their mean is the one process's; the estimates agree within 10%.
    one, _ = _measure(steps=100, m=16, tokens=16, seed=1)
    from tests import rank_processes

    rank_processes.start(_dp_worker, (str(tmp_path / "pg"), str(tmp_path / "est")), 2)
    (two, shadowed) = zip(*(torch.load(f"{tmp_path / 'est'}.{r}") for r in (0, 1)))
    assert two[0] == two[1]  # every replica holds the same estimate
    assert two[0] == pytest.approx(one, rel=0.10)
    # shadow gradients, summed over the replicas apart from .grad, give the same estimate (Note [shadow gradients])
    assert shadowed[0] == shadowed[1] == pytest.approx(two[0], rel=1e-9)
