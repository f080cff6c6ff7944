"""A Freezer that freezes what a recorded run froze (its frozen_sets.jsonl), for `tfrun retime` (tfrun.retime Note
[paired time]): the same work, step by step and action by action, run again beside other runs.

A baseline's signal (APF, AutoFreeze) still reads the gradients and the update before and after each optimizer step,
so the replay pays its cost as the run did; what it decides is not used, the recorded sets are.
"""

from __future__ import annotations

from tfrun.errors import TfrunError
from tfrun.freeze.freezing import Freezer, Selection
from tfrun.records.frozen_sets import FrozenSets


class ReplayFreezer(Freezer):
    """Freezer whose selections come from `replay(sets, signal)`'s recorded run."""

    sets: FrozenSets | None = None

    def replay(self, sets: FrozenSets, signal) -> None:
        """Freeze what `sets` recorded from now on; `signal`: that run's baseline signal on this rank, or None."""
        for s, cands in self.stage_candidates.items():
            if s >= len(sets.tensors) or sets.tensors[s] != [c.name for c in cands]:
                raise TfrunError(f"the recorded run's stage {s} has other tensors than this model's: not the same "
                                 "model or stage split")
        self.sets, self.signal = sets, signal

    def selection(self, step: int, stage: int, mb: int) -> Selection:
        assert self.sets is not None, "replay() first"
        names = self.sets.steps[step][stage][mb]
        return self._selection(stage, {i for i, c in enumerate(self.stage_candidates[stage]) if c.name in names})
