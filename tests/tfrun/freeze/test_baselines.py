"""The baselines' metric and period logic on small hand-computed sequences, and their use by the Freezer."""

from __future__ import annotations

import pytest

torch = pytest.importorskip("torch")

from tfrun.freeze.baselines import (  # noqa: E402
    APFConfig,
    APFSignal,
    AutoFreezeConfig,
    AutoFreezeSignal,
    layer_of,
)
from tfrun.freeze.candidates import Candidate  # noqa: E402
from tfrun.freeze.freezing import Freezer  # noqa: E402


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
    with torch.no_grad():
        module.steady += 1.0
    apf._check(13, {0: module})  # unstable: the period halves
    assert apf.period[(0, "steady")] == 4


class Mixed(torch.nn.Module):
    """One tensor of four scalars: three oscillate (+1, -1, ...), the fourth keeps moving up."""

    def __init__(self) -> None:
        super().__init__()
        self.w = torch.nn.Parameter(torch.zeros(4))


def test_apf_decides_per_scalar_and_freezes_a_tensor_by_its_share_of_stable_scalars():
    # Checked every step with EMA 0.5: three scalars move +1, -1, +1, ... (perturbation 1, 1/3, 0.43, 0.33, ...
    # -> 1/3: stable below 0.45 from the second check), the fourth +1 every step (perturbation 1). So 3 of 4
    # scalars are stable (share 0.75), while the tensor's aggregate sum |EMA u| / sum EMA |u| is
    # (3 x 0.25 + 0.75) / (3 x 0.75 + 0.75) = 0.5 at the second check: per tensor, APF would call it unstable.
    for share, frozen_from in ((0.7, 2), (0.8, None)):
        cands = {0: [Candidate(name="w", cost=1.0)]}
        apf = APFSignal(cands, APFConfig(threshold=0.45, ema=0.5, check_every=1, stable_share=share))
        module = Mixed()
        frozen = []
        for step in range(8):
            apf.before_optimizer(step, {0: module})
            if apf.frozen(step, 0):
                frozen.append(step)
            else:
                with torch.no_grad():
                    module.w += torch.tensor([1.0, 1.0, 1.0, 0.0]) * (1.0 if step % 2 == 0 else -1.0)
                    module.w[3] += 1.0
            apf.after_optimizer(step, {0: module})
        assert (frozen[0] if frozen else None) == frozen_from
        if frozen_from is None:
            assert apf.stable_share[(0, "w")] == 0.75 and apf.perturbation[(0, "w")] < 0.45


def test_apf_snapshots_once_per_check_not_every_step():
    apf, module = _apf(check_every=4)
    for step in range(3):  # no check yet: the snapshot is still the start's value
        _step(apf, module, step)
    assert apf.snapshot[(0, "steady")].item() == 0.0 and not apf.stable_share
    _step(apf, module, 3)  # the check: a new interval starts from the value now
    assert apf.snapshot[(0, "steady")].item() == 4.0 and apf.perturbation[(0, "steady")] == 1.0


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


def test_autofreeze_takes_the_norm_of_the_gradient_accumulated_over_the_interval():
    cands = {0: [Candidate(name="layers.0.w", cost=1.0), Candidate(name="head.weight", cost=1.0)]}
    af = AutoFreezeSignal(cands, ["layers.0", "head"], AutoFreezeConfig(percentile=50.0, check_every=2),
                          num_microbatches=4)
    module = torch.nn.Module()
    module.layers = torch.nn.ModuleList([torch.nn.Module()])
    module.layers[0].w = torch.nn.Parameter(torch.zeros(2))
    module.head = torch.nn.Module()
    module.head.weight = torch.nn.Parameter(torch.zeros(2))
    grads = [([3.0, 0.0], [1.0, 1.0]), ([-1.0, 0.0], [1.0, 1.0])]
    for step, (w, h) in enumerate(grads):
        module.layers[0].w.grad, module.head.weight.grad = torch.tensor(w), torch.tensor(h)
        # step 1: the head was frozen in 2 of 4 micro-batches (a hybrid), so its sum counts twice
        af.before_optimizer(step, {0: module}, {(0, "head.weight"): 2} if step == 1 else {})
    # mean of (3, 0) and (-1, 0) is (1, 0): norm 1 (one step's would say 3 or 1); the head's (1, 1), (2, 2)
    assert af.prev == pytest.approx({"layers.0": 1.0, "head": 1.5 * 2 ** 0.5}) and not af.accum


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
