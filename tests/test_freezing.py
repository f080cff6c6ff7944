"""Freeze selection: cost-weighted shares, prefix policy on stage 0, random re-draws, ramp."""

from __future__ import annotations

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from tfrun.freezing import PREFIX, RANDOM, Candidate, Freezer, closest_prefix


def _items(costs):
    return [Candidate(name=f"p{i}", cost=float(c)) for i, c in enumerate(costs)]


@settings(max_examples=200, deadline=None)
@given(st.lists(st.integers(1, 1000), min_size=1, max_size=12), st.floats(0, 1))
def test_closest_prefix_is_closest_and_within_half_the_largest_tensor(costs, ratio):
    items = _items(costs)
    total = sum(costs)
    sel = closest_prefix(items, ratio)
    prefix_shares = [sum(costs[:k]) / total for k in range(len(costs) + 1)]
    assert abs(sel.share - ratio) == pytest.approx(min(abs(s - ratio) for s in prefix_shares), abs=1e-12)
    # Granularity bound: the realised share is within half the largest tensor's share of the plan.
    assert abs(sel.share - ratio) <= max(costs) / total / 2 + 1e-12
    assert sel.names == frozenset(f"p{i}" for i in range(len(sel.names)))


def test_share_is_by_elements_not_tensor_count():
    items = _items([1000, 1, 1, 1])  # one big matrix and three norm scales
    assert closest_prefix(items, 0.4).names == frozenset()  # nothing (gap .4) beats the matrix (gap .597)
    assert closest_prefix(items, 0.9).names == frozenset({"p0"})
    assert closest_prefix(items, 0.9).share == pytest.approx(1000 / 1003)


def test_ratio_zero_and_one():
    items = _items([3, 4, 5])
    assert closest_prefix(items, 0.0).names == frozenset()
    assert closest_prefix(items, 1.0).share == 1.0


def _freezer(**kw):
    cands = {0: _items([10] * 10), 1: _items([10] * 10)}
    ratios = {(s, m): 0.5 for s in (0, 1) for m in range(4)}
    return Freezer(cands, ratios, seed=7, **kw)


def test_stage_zero_freezes_a_prefix_other_stages_a_random_subset():
    f = _freezer()
    assert f.policy(0) == PREFIX and f.policy(1) == RANDOM
    assert f.selection(0, 0, 0).names == frozenset(f"p{i}" for i in range(5))
    chosen = [f.selection(0, 1, m).names for m in range(4)]
    assert all(len(c) == 5 for c in chosen)
    assert len(set(chosen)) > 1  # different micro-batches draw different subsets


def test_random_sets_are_redrawn_every_k_steps_and_reproducible():
    f = _freezer(redraw_every=3)
    a, b, c = (f.selection(step, 1, 0).names for step in (0, 2, 3))
    assert a == b and a != c
    # Same seed -> same sets (data-parallel replicas agree); another seed -> different.
    assert _freezer(redraw_every=3).selection(3, 1, 0).names == c
    other = Freezer({1: _items([10] * 10)}, {(1, 0): 0.5}, seed=8, redraw_every=3)
    assert any(other.selection(s, 1, 0).names != _freezer(redraw_every=3).selection(s, 1, 0).names
               for s in range(0, 30, 3))


def test_ramp_is_linear_to_the_plan():
    f = _freezer(ramp_steps=4)
    assert [f.ramp(s) for s in range(6)] == [0.25, 0.5, 0.75, 1.0, 1.0, 1.0]
    assert f.selection(0, 0, 0).share == pytest.approx(0.1)  # 0.5 x 0.25 rounded to one of ten tensors
    assert f.selection(5, 0, 0).share == pytest.approx(0.5)


def test_unplanned_actions_freeze_nothing():
    f = _freezer()
    assert f.selection(0, 1, 9).names == frozenset()


def test_parameters_frozen_from_the_start_are_never_candidates():
    torch = pytest.importorskip("torch")
    from tfrun.freezing import candidates

    module = torch.nn.Sequential(torch.nn.Linear(4, 4), torch.nn.Linear(4, 2))
    module[0].weight.requires_grad_(False)
    names = [c.name for c in candidates(module)]
    assert names == ["0.bias", "1.weight", "1.bias"]
    assert [c.cost for c in candidates(module)] == [4.0, 8.0, 2.0]
