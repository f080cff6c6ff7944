"""Freeze selection: costs, the window budget, rotation, skips, the stale guard, state and policies."""

from __future__ import annotations

import math

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from tfrun.freeze.allocate import rotate, skip_steps
from tfrun.freeze.candidates import Candidate
from tfrun.freeze.freezing import POLICIES, Freezer, stage_mode


def _items(costs):
    return [Candidate(name=f"p{i}", cost=float(c)) for i, c in enumerate(costs)]


def _run(freezer: Freezer, steps: range, record: bool = True):
    """Drive a Freezer as the runtime does; returns per step {(stage, mb): Selection}."""
    out = []
    m = freezer.num_microbatches
    for step in steps:
        cells, counts = {}, {}
        for s in sorted(freezer.stage_candidates):
            for j in range(m):
                sel = freezer.selection(step, s, j)
                cells[(s, j)] = sel
                for name in sel.names:
                    counts[(s, name)] = counts.get((s, name), 0) + 1
        if record:
            freezer.end_step(step, counts)
        out.append(cells)
    return out


# -- costs ---------------------------------------------------------------------------------------------------


def test_costs_are_weight_gradient_flops_per_token():
    torch = pytest.importorskip("torch")
    from tfrun.freeze.candidates import candidates

    module = torch.nn.ModuleDict({"emb": torch.nn.Embedding(1000, 8), "lin": torch.nn.Linear(8, 4),
                                  "norm": torch.nn.LayerNorm(8)})
    cost = {c.name: c.cost for c in candidates(module)}
    assert cost == {"emb.weight": 8.0, "lin.weight": 64.0, "lin.bias": 4.0, "norm.weight": 16.0,
                    "norm.bias": 16.0}


def test_embedding_is_a_small_share_of_the_tiny_first_stage():
    pytest.importorskip("torch")
    from tfrun.freeze.candidates import candidates
    from tfrun.models import MODELS, build_stage

    cands = candidates(build_stage(MODELS["tiny"], 0, 2, 0, device="meta"))
    total = sum(c.cost for c in cands)
    assert cands[0].name == "embed.weight" and cands[0].cost / total < 0.001  # by elements it was 5%
    assert len(cands) == 19


def test_tied_tensor_counted_once_with_both_costs():
    torch = pytest.importorskip("torch")
    from tfrun.freeze.candidates import candidates

    emb, head = torch.nn.Embedding(10, 4), torch.nn.Linear(4, 10, bias=False)
    head.weight = emb.weight
    cands = candidates(torch.nn.Sequential(emb, head))
    assert [(c.name, c.cost) for c in cands] == [("0.weight", 4.0 + 80.0)]


def test_parameters_frozen_from_the_start_are_never_candidates():
    torch = pytest.importorskip("torch")
    from tfrun.freeze.candidates import candidates

    module = torch.nn.Sequential(torch.nn.Linear(4, 4), torch.nn.Linear(4, 2))
    module[0].weight.requires_grad_(False)
    assert [c.name for c in candidates(module)] == ["0.bias", "1.weight", "1.bias"]


# -- allocation primitives -----------------------------------------------------------------------------------

ALLOWANCES = st.integers(1, 12).flatmap(
    lambda m: st.lists(st.lists(st.floats(0, 1), min_size=m, max_size=m), min_size=1, max_size=12))


@settings(max_examples=300, deadline=None)
@given(st.lists(st.integers(1, 1000), min_size=1, max_size=25), ALLOWANCES, st.randoms(use_true_random=False),
       st.booleans())
def test_rotation_never_spends_more_than_earned_and_covers_every_tensor(costs, allowance, rng, by_priority):
    order = rng.sample(range(len(costs)), len(costs))
    priority = [rng.random() for _ in costs] if by_priority else None  # Note [goodput order]: the same guarantees
    cells = rotate(costs, order, allowance, priority)
    total = sum(costs)
    largest = max(costs) / total
    for j in range(len(allowance[0])):
        earned = spent = 0.0
        for t, row in enumerate(allowance):
            earned += row[j]
            spent += sum(costs[i] for i in cells[t][j]) / total
            assert spent <= earned + 1e-9  # never ahead of the plan (Note [window budget])
        assert spent >= earned - largest - 1e-9  # and short by less than one tensor
    unfrozen = sum(1 - a for row in allowance for a in row)
    if unfrozen >= 1 or any(a == 0 for row in allowance for a in row):  # a turn of the circle
        seen = set().union(*(set(range(len(costs))) - cell for row in cells for cell in row))
        assert seen == set(range(len(costs)))


@settings(max_examples=300, deadline=None)
@given(ALLOWANCES)
def test_skips_fit_the_stage_budget_and_only_where_allowed(allowance):
    m = len(allowance[0])
    debt = [0.0] * m
    skip, debt = skip_steps(allowance, debt)
    planned = sum(a for row in allowance for a in row)
    done = sum(s for row in skip for s in row)
    assert done <= planned + 1e-9
    assert done > planned - 1 - 1e-9  # short by less than one backward
    assert all(not s or a > 0 for srow, arow in zip(skip, allowance) for s, a in zip(srow, arow))
    assert abs(sum(debt)) < 1e-9


def test_skips_are_spread_over_steps_and_staggered_over_microbatches():
    skip, _ = skip_steps([[0.5] * 4] * 10, [0.0] * 4)
    per_mb = [[t for t in range(10) if skip[t][j]] for j in range(4)]
    assert all(len(ts) == 5 for ts in per_mb)
    assert all(b - a == 2 for ts in per_mb for a, b in zip(ts, ts[1:]))  # every other step
    assert all(sum(row) == 2 for row in skip)  # two of four micro-batches skip in every step


@pytest.mark.parametrize("ratios", [[0.37, 0.05, 0.9, 0.61], [0.95, 0.04], [0.5, 0.01, 0.01, 0.3, 0.99]])
def test_skip_debt_stays_bounded_and_each_action_converges_to_its_own_ratio(ratios):
    m = len(ratios)
    debt, counts, windows = [0.0] * m, [0] * m, 300
    budget_total = 0
    for _ in range(windows):
        skip, debt = skip_steps([ratios] * 10, debt)
        assert max(abs(d) for d in debt) < 2.0
        budget_total += int(sum(ratios) * 10 + 1e-9)
        for j in range(m):
            counts[j] += sum(row[j] for row in skip)
    # The stage gets floor(sum of allowances) per window; each action its share of that.
    for j, r in enumerate(ratios):
        expected = r * (budget_total / windows) / (sum(ratios) * 10)
        assert counts[j] / (10 * windows) == pytest.approx(expected, abs=0.01)


# -- the Freezer ---------------------------------------------------------------------------------------------

PLANS = st.fixed_dictionaries({
    "m": st.integers(1, 8), "w": st.integers(1, 10), "policy": st.sampled_from(POLICIES),
    "ratios": st.lists(st.floats(0, 0.9), min_size=16, max_size=16), "seed": st.integers(0, 5),
})


@settings(max_examples=60, deadline=None)
@given(PLANS)
def test_every_window_keeps_the_stage_mean_and_updates_every_tensor(p):
    m, w = p["m"], p["w"]
    stages = {0: _items([5, 40, 40, 80, 3, 80, 80]), 1: _items([40, 40, 80, 80, 80, 2, 2, 900])}
    ratios = {(s, j): p["ratios"][s * 8 + j] for s in stages for j in range(m)}
    f = Freezer(stages, ratios, num_microbatches=m, seed=p["seed"], redraw_every=w, policy=p["policy"])
    steps = _run(f, range(3 * w))
    for s, cands in stages.items():
        total = sum(c.cost for c in cands)
        planned = sum(ratios[(s, j)] for j in range(m)) / m
        for k in range(3):
            window = steps[k * w:(k + 1) * w]
            realised = sum(cells[(s, j)].share for cells in window for j in range(m)) / (w * m)
            assert realised <= planned + 1e-9
            for cells in window:  # shares are cost shares of the names
                for j in range(m):
                    sel = cells[(s, j)]
                    assert sel.share == pytest.approx(sum(c.cost for c in cands if c.name in sel.names) / total)
            unfrozen = w * m * (1 - max(ratios[(s, j)] for j in range(m)))
            mode = stage_mode(p["policy"], s)
            if mode in ("rotate", "skip", "prefix|rotate") and unfrozen >= 1:
                for c in cands:  # Note [rotation], Note [skip]: every tensor learns in every window
                    assert any(c.name not in cells[(s, j)].names for cells in window for j in range(m))


def test_prefix_starves_the_front_and_auto_does_not():
    stage0 = _items([10] * 10)
    ratios = {(0, j): 0.9 for j in range(8)}
    for policy, starved in (("prefix", True), ("auto", False), ("random", False), ("skip", False)):
        f = Freezer({0: stage0}, ratios, num_microbatches=8, seed=1, policy=policy)
        _run(f, range(40))
        assert (f.stats[0].steps_updated[0] == 0) == starved, policy
        if not starved:
            assert max(f.stats[0].longest_gap) < 2 * 10  # at least once per window


def test_auto_freezes_prefixes_on_stage_0_while_the_plan_leaves_a_microbatch_unfrozen():
    stage0 = _items([1, 30, 30, 30, 30, 30])
    kw = dict(num_microbatches=4, seed=3)
    covered = {(0, 0): 0.5, (0, 1): 0.5, (0, 2): 0.5}  # micro-batch 3 trains the whole stage every step
    auto = _run(Freezer({0: stage0}, covered, policy="auto", **kw), range(10))
    assert auto == _run(Freezer({0: stage0}, covered, policy="prefix", **kw), range(10))
    assert all(cells[(0, j)].names == {f"p{i}" for i in range(len(cells[(0, j)].names))}  # prefixes
               for cells in auto for j in range(4))
    starved = {(0, j): 0.5 for j in range(4)}  # a prefix would never train p0: rotate, as `random` does
    auto = _run(Freezer({0: stage0}, starved, policy="auto", **kw), range(10))
    assert auto == _run(Freezer({0: stage0}, starved, policy="random", **kw), range(10))


def test_stale_guard_bounds_the_gap_even_at_ratio_one():
    stages = {1: _items([10, 20, 30])}
    ratios = {(1, j): 1.0 for j in range(4)}
    off = Freezer(stages, ratios, num_microbatches=4, seed=0)
    _run(off, range(20))
    assert off.stats[1].steps_updated == [0, 0, 0]
    guarded = Freezer(stages, ratios, num_microbatches=4, seed=0, max_stale_steps=3)
    _run(guarded, range(20))
    assert max(guarded.stats[1].longest_gap) == 3
    assert all(n == 5 for n in guarded.stats[1].steps_updated)  # steps 3, 7, 11, 15, 19


class _Ticking:
    """A baseline signal whose preferred tensors change at every step (as an APF check may)."""

    def __init__(self):
        self.now = 0

    def preferred(self, step, stage):
        return {f"p{self.now % 6}"}

    def state_dict(self):
        return {"now": self.now}

    def load_state_dict(self, state):
        self.now = state["now"]


class _Noise:
    """A noise meter whose per-tensor estimates change every step (as tfrun.freeze.noise's moving averages do)."""

    def __init__(self):
        self.now = 0

    def tensor_estimates(self, stage):
        return {f"p{i}": (1.0 + (i * 7 + self.now) % 5, 100.0 * (1 + (i + self.now) % 3)) for i in range(8)}


def test_the_goodput_policy_keeps_the_most_valuable_tensors_learning_most():
    stages = {1: _items([10] * 8)}
    noise = _Noise()
    f = Freezer(stages, {(1, j): 0.75 for j in range(4)}, num_microbatches=4, seed=0, redraw_every=5,
                policy="goodput", noise=noise, batch_tokens=1000.0)
    estimates = noise.tensor_estimates(1)
    value = {n: 1000 * t / (1000 + t / g) ** 2 for n, (g, t) in estimates.items()}  # per unit of equal costs
    steps = _run(f, range(5))
    unfrozen = {n: sum(n not in cells[(1, j)].names for cells in steps for j in range(4)) for n in value}
    assert all(count >= 1 for count in unfrozen.values())  # every tensor learns in the window
    best, worst = max(value, key=value.get), min(value, key=value.get)
    assert unfrozen[best] > unfrozen[worst]
    realised = sum(cells[(1, j)].share for cells in steps for j in range(4)) / 20
    assert realised <= 0.75 + 1e-9


@pytest.mark.parametrize("policy", [*POLICIES, "hybrid"])
def test_resume_from_state_equals_uninterrupted(policy):
    stages = {0: _items([3, 5, 8, 13, 21]), 1: _items([1, 2, 3, 5, 8, 13])}
    ratios = {(s, j): (0.25 + 0.2 * j + 0.1 * s) % 1.0 for s in stages for j in range(5)}
    kw = dict(num_microbatches=5, seed=4, redraw_every=4, ramp_steps=6, policy="auto" if policy == "hybrid" else
              policy, max_stale_steps=2)

    def make():
        if policy != "hybrid":
            return Freezer(stages, ratios, **kw, noise=_Noise(), batch_tokens=500.0)
        return Freezer(stages, ratios, **kw, signal=_Ticking(), hybrid=True)

    def run(f, steps):  # the signal and the noise estimates move on after every step
        out = []
        for step in steps:
            out += _run(f, range(step, step + 1))
            if f.signal is not None:
                f.signal.now += 1
            if f.noise is not None:
                f.noise.now = step + 1
        return out

    whole = run(make(), range(23))
    first = make()
    head = run(first, range(13))  # 13: in the middle of a window, after the signal moved
    second = make()
    second.load_state_dict(first.state_dict())
    if second.noise is not None:  # the meter's own state comes back from the checkpoint too
        second.noise.now = 13
    tail = run(second, range(13, 23))
    assert head + tail == whole


def test_a_new_plan_starts_its_own_windows_and_ramp():
    stages = {1: _items([10] * 10)}
    f = Freezer(stages, {(1, 0): 0.2}, num_microbatches=1, seed=0, redraw_every=4)
    _run(f, range(5))
    f.set_plan({(1, 0): 0.8}, 5, 2)
    shares = [cells[(1, 0)].share for cells in _run(f, range(5, 9))]
    assert shares == pytest.approx([0.4, 0.8, 0.8, 0.8])  # ramp over 2 steps from step 5


def test_ramp_scales_the_plan():
    f = Freezer({1: _items([10] * 10)}, {(1, 0): 0.8}, num_microbatches=1, seed=0, ramp_steps=4, redraw_every=4)
    shares = [cells[(1, 0)].share for cells in _run(f, range(8))]
    assert sum(shares[:4]) <= 0.8 * (0.25 + 0.5 + 0.75 + 1.0) + 1e-9
    assert shares[4:] == [0.8] * 4


def test_unplanned_actions_freeze_nothing_and_selection_is_replica_independent():
    stages = {1: _items([10] * 6)}
    a = Freezer(stages, {(1, 0): 0.5}, num_microbatches=3, seed=9)
    b = Freezer(stages, {(1, 0): 0.5}, num_microbatches=3, seed=9)
    assert _run(a, range(12)) == _run(b, range(12))
    assert all(a.selection(s, 1, 2).names == frozenset() for s in range(12))
    assert math.isclose(a.selection(0, 1, 0).share, 0.5)


class _Estimates:
    """Per-tensor (|G|^2, tr(Sigma)) for the goodput policy, fixed."""

    def tensor_estimates(self, stage):
        return {f"s{stage}p{i}": (1.0 + i, 10.0 * (i % 3 + 1)) for i in range(6)}


def _digest(measured: dict[int, frozenset[int]] | None = None) -> str:
    """sha256 over the selections of every policy, with and without the stale guard, through a re-plan and a probe."""
    import hashlib
    import json

    cands = {s: [Candidate(name=f"s{s}p{i}", cost=float(1 + (i * 7 + s) % 5)) for i in range(6)] for s in (0, 1)}
    ratios = {(s, j): [0.0, 0.3, 0.9, 0.5, 0.75, 0.2][(s + j) % 6] for s in (0, 1) for j in range(5)}
    h = hashlib.sha256()
    for policy in POLICIES:
        for stale in (0, 2):
            f = Freezer(cands, ratios, num_microbatches=5, seed=3, redraw_every=4, ramp_steps=3, policy=policy,
                        max_stale_steps=stale, noise=_Estimates(), batch_tokens=640.0)
            for step in range(23):
                if step == 11:
                    f.set_plan({k: min(1.0, v + 0.1) for k, v in ratios.items()}, 11, 2)
                if step == 17:
                    f.set_probe(17, 2)
                if measured and step in measured:
                    f.set_measured(step, measured[step])
                counts = {}
                for s in (0, 1):
                    for j in range(5):
                        sel = f.selection(step, s, j)
                        h.update(json.dumps([policy, stale, step, s, j, sorted(sel.names), round(sel.share, 12)])
                                 .encode())
                        for n in sel.names:
                            counts[(s, n)] = counts.get((s, n), 0) + 1
                f.end_step(step, counts)
    return h.hexdigest()


def test_selections_without_a_measured_block_are_those_of_before_issue_46():
    # Every freeze mode but timely --objective goodput runs the Freezer without set_measured: its selections must be
    # bit for bit those the code made before the goodput controller (digest recorded from commit 5218a1a).
    assert _digest() == "86d53481c83d3d00bc32b58ac1808bccdd48044007a2bbf6a9a33d71a72e0227"


def test_a_measured_block_freezes_nothing_at_its_step_only():
    stages = {s: _items([1, 2, 3, 4]) for s in (0, 1)}
    f = Freezer(stages, {(s, j): 0.75 for s in (0, 1) for j in range(4)}, num_microbatches=4, seed=1)
    plain = Freezer(stages, {(s, j): 0.75 for s in (0, 1) for j in range(4)}, num_microbatches=4, seed=1)
    f.set_measured(5, frozenset({1, 2}))
    for step in range(8):
        for s in (0, 1):
            for j in range(4):
                got, want = f.selection(step, s, j), plain.selection(step, s, j)
                assert got == (_selection_none() if step == 5 and j in (1, 2) else want)
                # what the plan freezes there is named as shadows (tfrun.freeze.noise Note [shadow gradients])
                assert f.shadowed(step, s, j) == (want.names if step == 5 and j in (1, 2) else frozenset())
    assert any(f.shadowed(5, s, j) for s in (0, 1) for j in (1, 2))  # the test is not vacuous at 0.75


def _selection_none():
    from tfrun.freeze.freezing import Selection

    return Selection(names=frozenset(), share=0.0)
