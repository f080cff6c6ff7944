"""tfrun.timing's per-step table: what `tfplan explain` replays step by step."""

from __future__ import annotations

import statistics

from tests.conftest import torch_or_skip


def _records(steps: range, actions: list[str]):
    from tfrun.timing import ActionTime

    # Step s, action i: starts at 10 i ms and lasts s + i / 3 ms (not a round number of us).
    return [ActionTime(s, a, i % 2, 10.0 * i, 10.0 * i + s + i / 3) for s in steps for i, a in enumerate(actions)]


def test_step_durations_keep_the_last_complete_steps_to_the_microsecond():
    torch_or_skip()
    from tfrun.timing import action_table, step_durations

    actions = ["0F0", "1F0", "1B0", "0B0"]
    records = _records(range(1, 8), actions)
    records = [r for r in records if not (r.step == 7 and r.action == "0B0")]  # step 7 cut short
    table = step_durations(records, kept=4)
    assert table["actions"] == sorted(actions)
    assert list(table["ms"]) == ["3", "4", "5", "6"]  # the last four complete steps
    i = table["actions"].index("1B0")
    assert table["ms"]["5"][i] == round(5 + 2 / 3, 3)
    full = step_durations(r for r in records if r.step < 7)
    medians = action_table(r for r in records if r.step < 7)
    for j, a in enumerate(full["actions"]):  # the table's columns have the run's medians
        assert abs(statistics.median(row[j] for row in full["ms"].values()) - medians[a]["duration_ms"]) < 1e-3
    assert step_durations([]) == {"actions": [], "ms": {}}
