"""tfrun.freeze.replay: a ReplayFreezer freezes, action by action, what a recorded run froze, at the share its
candidates' costs give; a record of another model is refused in one line."""

from __future__ import annotations

import pytest

pytest.importorskip("torch")

from tfrun.errors import TfrunError  # noqa: E402
from tfrun.freeze.candidates import Candidate  # noqa: E402
from tfrun.freeze.replay import ReplayFreezer  # noqa: E402
from tfrun.records.frozen_sets import FrozenSets  # noqa: E402

CANDS = {0: [Candidate(name="a", cost=1.0), Candidate(name="b", cost=3.0)], 1: [Candidate(name="c", cost=2.0)]}


def _freezer() -> ReplayFreezer:
    return ReplayFreezer(CANDS, {(0, 0): 0.9, (1, 1): 0.9}, num_microbatches=2, seed=0)


def test_selections_are_the_recorded_sets_at_their_cost_share() -> None:
    sets = FrozenSets(tensors=[["a", "b"], ["c"]], steps={7: [[frozenset({"b"}), frozenset()],
                                                              [frozenset(), frozenset({"c"})]]})
    freezer = _freezer()
    freezer.replay(sets, None)
    assert freezer.selection(7, 0, 0).names == {"b"} and freezer.selection(7, 0, 0).share == 0.75
    assert freezer.selection(7, 0, 1).names == frozenset() and freezer.selection(7, 0, 1).share == 0.0
    assert freezer.selection(7, 1, 1).share == 1.0  # not the plan's 0.9: what the run did


def test_a_record_of_other_tensors_is_refused() -> None:
    with pytest.raises(TfrunError, match="stage 0 has other tensors"):
        _freezer().replay(FrozenSets(tensors=[["a"], ["c"]], steps={}), None)
