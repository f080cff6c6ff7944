"""A per-layer profile split into stages (tfplan.cost.layers, Note [layer partition]): stage counts, the balanced
split against brute force, explicit splits and their errors, and a per-layer profile file."""

from __future__ import annotations

import itertools
import json
import math

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from tests.tfplan.cost.profile_objects import DELETE, STAGE, _set, _valid
from tfplan.cost import profile
from tfplan.cost.profile import COST_FIELDS, Profile, StageCost
from tfplan.errors import TfplanError


def test_stage_count_mismatch() -> None:
    prof = profile.from_dict(_valid(3))
    assert len(prof.stage_costs(3)) == 3
    with pytest.raises(TfplanError, match="profile 't' has 3 stages but the schedule has 4"):
        prof.stage_costs(4)
    with pytest.raises(TfplanError, match="is per stage; --layers-per-stage needs a per-layer profile"):
        prof.stage_costs(3, [1, 1, 1])


def _layer(f: float, b: float, **kw) -> StageCost:
    fields = dict(
        forward_ms=f,
        backward_ms=b,
        backward_frozen_ms=b / 2,
        backward_input_ms=b / 2,
        backward_weight_ms=b / 2,
        backward_weight_frozen_ms=b / 10,
    )
    return StageCost(**(fields | kw))


def _layer_profile(layers) -> Profile:
    return Profile(name="layers", p2p_ms=0.0, layers=tuple(layers))


def _brute_force_best(weights: list[float], parts: int) -> float:
    """Smallest possible largest group sum over every contiguous split into non-empty groups."""
    n = len(weights)
    best = math.inf
    for cuts in itertools.combinations(range(1, n), parts - 1):
        bounds = (0, *cuts, n)
        best = min(best, max(math.fsum(weights[a:b]) for a, b in itertools.pairwise(bounds)))
    return best


@settings(max_examples=50, deadline=None)
@given(
    data=st.lists(
        st.tuples(st.floats(0.0, 10.0, allow_nan=False), st.floats(0.0, 10.0, allow_nan=False)), min_size=1, max_size=8
    ),
    parts_seed=st.integers(0, 100),
)
def test_balanced_split_minimises_the_largest_stage(data, parts_seed: int) -> None:
    layers = [_layer(f, b) for f, b in data]
    parts = 1 + parts_seed % len(layers)
    stages = _layer_profile(layers).stage_costs(parts)
    assert len(stages) == parts
    stage_time = [c.forward_ms + c.backward_ms for c in stages]
    weights = [f + b for f, b in data]
    assert max(stage_time) == pytest.approx(_brute_force_best(weights, parts), rel=1e-12, abs=1e-12)
    # The stages cover the layers contiguously: forward sums add up, and every stage is non-empty.
    assert math.fsum(c.forward_ms for c in stages) == pytest.approx(math.fsum(f for f, _ in data), abs=1e-9)


def test_balanced_split_example() -> None:
    layers = [_layer(1, 0), _layer(1, 0), _layer(1, 0), _layer(1, 0), _layer(4, 0)]
    stages = _layer_profile(layers).stage_costs(2)
    assert [c.forward_ms for c in stages] == [4.0, 4.0]
    assert [c.name for c in stages] == ["layers 0..3", "layers 4..4"]


def test_explicit_split_sums_fields_and_applies_first_stage_rule() -> None:
    layers = [
        _layer(1.0, 2.0, name="embed"),
        _layer(2.0, 4.0, name="block0"),
        _layer(3.0, 6.0, name="block1"),
        _layer(4.0, 8.0, name="head"),
    ]
    s0, s1 = _layer_profile(layers).stage_costs(2, [3, 1])
    assert s0.name == "embed..block1" and s1.name == "head..head"
    # First stage: no input gradient is needed, so frozen backward and I are 0 and W is the whole backward.
    assert s0.forward_ms == 6.0 and s0.backward_ms == 12.0
    assert s0.backward_frozen_ms == 0.0 and s0.backward_input_ms == 0.0
    assert s0.backward_weight_ms == 12.0 and s0.backward_weight_frozen_ms == 0.0
    # Other stages: plain sums of their layers.
    assert s1 == _layer(4.0, 8.0, name="head..head")


def test_later_stages_sum_every_field() -> None:
    layers = [_layer(1.0, 1.0), _layer(0.5, 3.0), _layer(0.25, 5.0)]
    _, s1 = _layer_profile(layers).stage_costs(2, [1, 2])
    for f in COST_FIELDS:
        assert getattr(s1, f) == pytest.approx(getattr(layers[1], f) + getattr(layers[2], f))


@pytest.mark.parametrize(
    ("counts", "message"),
    [
        ([1, 1], "--layers-per-stage gives 2 stages but the schedule has 3"),
        ([1, 1, 1], r"--layers-per-stage must be positive and sum to the 4 layers, got \[1, 1, 1\]"),
        ([0, 2, 2], r"must be positive and sum to the 4 layers, got \[0, 2, 2\]"),
        ([3, 2, -1], "must be positive"),
    ],
)
def test_explicit_split_errors(counts, message: str) -> None:
    prof = _layer_profile([_layer(1, 1)] * 4)
    with pytest.raises(TfplanError, match=message):
        prof.stage_costs(3, counts)


def test_fewer_layers_than_stages() -> None:
    with pytest.raises(TfplanError, match="profile has 2 layers, fewer than the 3 stages asked for"):
        _layer_profile([_layer(1, 1)] * 2).stage_costs(3)


def test_layer_profile_json_round_trip(tmp_path) -> None:
    obj = _set(_valid(), "stages", DELETE) | {"layers": [dict(STAGE, name=f"l{i}") for i in range(5)]}
    path = tmp_path / "layers.json"
    path.write_text(json.dumps(obj))
    prof = profile.load(path)
    assert prof.stages is None and len(prof.layers) == 5
    assert profile.from_dict(prof.to_dict()) == prof
    stages = prof.stage_costs(2)
    assert [c.name for c in stages] in (["l0..l2", "l3..l4"], ["l0..l1", "l2..l4"])
