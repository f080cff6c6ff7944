"""The baselines' metric and period logic on small hand-computed sequences, and their use by the Freezer."""

from __future__ import annotations

import pytest

torch = pytest.importorskip("torch")

from tfrun.baselines import (  # noqa: E402
    APFConfig,
    APFSignal,
    AutoFreezeConfig,
    AutoFreezeSignal,
    layer_of,
)
from tfrun.freezing import Candidate, Freezer  # noqa: E402


class Two(torch.nn.Module):
    """Two one-element parameters: `steady` always moves up by 1, `swing` moves +1, -1, +1, ..."""

    def __init__(self) -> None:
        super().__init__()
        self.steady = torch.nn.Parameter(torch.zeros(1))
        self.swing = torch.nn.Parameter(torch.zeros(1))


def _apf(check_every: int = 2, ema: float = 0.5) -> tuple[APFSignal, Two]:
    cands = {0: [Candidate(name="steady", cost=1.0), Candidate(name="swing", cost=1.0)]}
    return APFSignal(cands, APFConfig(threshold=0.05, ema=ema, check_every=check_every)), Two()


def _step(apf: APFSignal, module: Two, step: int) -> None:
    """One optimizer step as the trainer runs it: frozen tensors do not move."""
    apf.before_optimizer(step, {0: module})
    with torch.no_grad():
        frozen = apf.frozen(step, 0)
        if "steady" not in frozen:
            module.steady += 1.0
        if "swing" not in frozen:
            module.swing += 1.0 if step % 2 == 0 else -1.0
    apf.after_optimizer(step, {0: module})


def test_apf_perturbation_by_hand():
    # check_every 2: the swing's accumulated update is +1 - 1 = 0 at every check, so its perturbation is
    # |EMA(0)| / EMA(|0|) -> 0 (stable); the steady tensor accumulates +2 per check: perturbation 1.
    apf, module = _apf()
    _step(apf, module, 0)
    _step(apf, module, 1)
    assert apf.perturbation == {(0, "steady"): 1.0, (0, "swing"): 0.0}
    # Stable at the check after step 1: frozen for its period (1 check = 2 steps), then the period grows.
    assert apf.frozen(2, 0) == {"swing"} and apf.frozen(3, 0) == {"swing"} and apf.frozen(4, 0) == set()
    assert apf.period[(0, "swing")] == 2 and apf.period[(0, "steady")] == 1


def test_apf_periods_grow_additively_and_halve_when_unstable():
    apf, module = _apf()
    frozen_steps = []
    for step in range(12):
        if "swing" in apf.frozen(step, 0):
            frozen_steps.append(step)
        _step(apf, module, step)
    # Checks at steps 1, 5 and 11 found the swing stable: frozen 2, then 4 steps, then from step 12 for 6
    # (periods 1, 2, 3 checks of 2 steps); the checks while it was frozen saw no update and decided nothing.
    assert frozen_steps == [2, 3, 6, 7, 8, 9] and apf.period[(0, "swing")] == 4
    assert [s for s in range(12, 20) if "swing" in apf.frozen(s, 0)] == list(range(12, 18))
    assert "steady" not in {n for s in range(12) for n in apf.frozen(s, 0)}
    apf.period[(0, "steady")] = 8
    apf.accum[(0, "steady")] = torch.ones(1)
    apf._check(13)  # unstable: the period halves
    assert apf.period[(0, "steady")] == 4


def test_apf_state_round_trip_gives_the_same_future():
    a, ma = _apf()
    for step in range(7):
        _step(a, ma, step)
    b, mb = _apf()
    b.load_state_dict(a.state_dict())
    mb.load_state_dict(ma.state_dict())
    for step in range(7, 20):
        _step(a, ma, step)
        _step(b, mb, step)
        assert a.frozen(step + 1, 0) == b.frozen(step + 1, 0)


def _autofreeze(check_every: int = 1) -> AutoFreezeSignal:
    names = ["embed.weight", "layers.0.w", "layers.1.w", "layers.2.w", "norm.weight", "head.weight"]
    cands = {0: [Candidate(name=n, cost=1.0) for n in names]}
    return AutoFreezeSignal(cands, [layer_of(n) for n in names], AutoFreezeConfig(percentile=50.0,
                                                                                    check_every=check_every))


def test_autofreeze_freezes_front_to_back_below_the_median_rate_and_never_thaws():
    af = _autofreeze()
    assert af.layers == ["embed", "layers.0", "layers.1", "layers.2", "head"]
    af.decide({"embed": 1.0, "layers.0": 1.0, "layers.1": 1.0, "layers.2": 1.0, "head": 1.0})  # no rates yet
    assert af.frozen_front == 0
    # rates: embed 0.01, layers.0 0.02, layers.1 0.5, layers.2 0.03, head 0.9; median 0.03: the front run of
    # rates below it is embed and layers.0 (layers.2 is below too but sits behind layers.1).
    af.decide({"embed": 1.01, "layers.0": 0.98, "layers.1": 1.5, "layers.2": 1.03, "head": 1.9})
    assert af.frozen_front == 2 and af.frozen(0, 0) == {"embed.weight", "layers.0.w"}
    af.decide({"layers.1": 1.5, "layers.2": 1.03, "head": 1.9})  # rates 0, 0, 0: threshold 0, none below it
    assert af.frozen_front == 2  # never thaws, and freezes only below the threshold
    af.decide({"layers.1": 3.0, "layers.2": 1.0, "head": 1.9})  # rates 1.0, 0.029, 0: median 0.029
    assert af.frozen_front == 2  # layers.1 is the next layer and it is not stable


def test_a_baseline_freezes_the_same_tensors_in_every_microbatch():
    af = _autofreeze()
    af.frozen_front = 2
    cands = {0: [Candidate(name=n, cost=1.0) for n in ("embed.weight", "layers.0.w", "layers.1.w")]}
    f = Freezer(cands, {(0, 0): 0.9}, num_microbatches=4, seed=0, signal=af)
    sels = [f.selection(5, 0, m) for m in range(4)]
    assert all(s.names == {"embed.weight", "layers.0.w"} for s in sels)  # the plan's ratios are ignored
    assert sels[0].share == pytest.approx(2 / 3)


def test_the_hybrid_keeps_the_plan_and_prefers_the_baselines_tensors():
    names = [f"p{i}" for i in range(10)]
    cands = {1: [Candidate(name=n, cost=1.0) for n in names]}

    class Likes:
        def preferred(self, step, stage):
            return {"p7", "p8", "p9"}

    f = Freezer(cands, {(1, m): 0.3 for m in range(4)}, num_microbatches=4, seed=0, signal=Likes(), hybrid=True)
    counts = {n: 0 for n in names}
    shares = []
    for step in range(20):
        for m in range(4):
            sel = f.selection(step, 1, m)
            shares.append(sel.share)
            for n in sel.names:
                counts[n] += 1
    assert sum(shares) / len(shares) <= 0.3 + 1e-9  # the plan's budget, never more
    assert min(counts["p7"], counts["p8"], counts["p9"]) > 4 * max(counts[n] for n in names[:7])
