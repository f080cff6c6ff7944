"""tfrun.measure.timing's per-step table: what `tfplan explain` replays step by step."""

from __future__ import annotations

import statistics

from tests.conftest import torch_or_skip


def _records(steps: range, actions: list[str]):
    from tfrun.measure.timing import ActionTime

    # Step s, action i: starts at 10 i ms and lasts s + i / 3 ms (not a round number of us).
    return [ActionTime(s, a, i % 2, 10.0 * i, 10.0 * i + s + i / 3) for s in steps for i, a in enumerate(actions)]


def test_step_durations_keep_the_last_complete_steps_to_the_microsecond():
    torch_or_skip()
    from tfrun.measure.timing import action_table, step_durations

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


def test_the_timer_keeps_the_newest_steps_and_reads_a_window_of_them():
    torch = torch_or_skip()
    from tfrun.measure.timing import ActionTime, ActionTimer

    timer = ActionTimer(0, torch.device("cpu"), kept_steps=3)
    timer.enabled = True
    for step in range(5):
        timer.begin_step(step)
        timer.time(f"0F{step}", lambda: None)
        timer.span("optimizer", lambda: None)
        timer.end_step()
    assert [r.step for r in timer.records] == [2, 3, 4] and [r.step for r in timer.spans] == [2, 3, 4]
    records, spans = timer.window(3, 5)
    assert [r.action for r in records] == ["0F3", "0F4"] and [s.step for s in spans] == [3, 4]
    assert timer.window(0, 2) == ([], [])  # dropped
    timer.restore([ActionTime(0, "0F0", 0, 0.0, 1.0)], [])  # a resume puts its measuring steps back
    assert [r.action for r in timer.window(0, 1)[0]] == ["0F0"]


def test_the_wall_clock_adds_up_to_the_elapsed_time_less_what_was_excluded(monkeypatch):
    from tfrun.measure import wallclock

    now = [100.0]
    monkeypatch.setattr(wallclock.time, "perf_counter", lambda: now[0])
    clock = wallclock.WallClock()
    now[0] += 0.5  # a step's compute and its between-step work
    _, eval_ms = clock.excluded(lambda: now.__setitem__(0, now[0] + 2.0))  # an evaluation of 2 s
    now[0] += 0.25
    first = clock.close()
    now[0] += 0.125  # a checkpoint after the row closed counts in the next row
    second = clock.close()
    assert eval_ms == 2000.0 and first == 750.0 and second == 125.0
