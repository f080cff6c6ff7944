"""Schedule generators equal torch 2.13's order; CSV round trips and loads in torch's runtime."""

from __future__ import annotations

import csv
import io

import pytest

from tests.conftest import GOLDEN, torch_or_skip
from tfplan.errors import TfplanError
from tfplan.schedule import schedules
from tfplan.schedule.actions import Action

# (ranks, micro-batches): odd rank counts and micro-batch counts that are not multiples of the ranks.
GRID = [(p, m) for p in (1, 2, 3, 4, 5) for m in (1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 12, 16)]


def _stages_per_rank(spec: schedules.ScheduleSpec) -> list[int]:
    if spec.max_stages_per_rank is not None:
        return list(range(spec.min_stages_per_rank, spec.max_stages_per_rank + 1))
    return [v for v in (1, 2, 3) if v >= spec.min_stages_per_rank]


CASES = [(name, p, v, m) for name, spec in schedules.SCHEDULES.items() for v in _stages_per_rank(spec) for p, m in GRID]


def _ours(name: str, p: int, v: int, m: int) -> list[list[str]] | None:
    try:
        sched = schedules.generate(name, p, m, v)
    except TfplanError:
        return None
    return [[str(a) for a in rank] for rank in sched.order]


@pytest.mark.parametrize(("name", "p", "v", "m"), CASES, ids=[f"{n}-P{p}-V{v}-M{m}" for n, p, v, m in CASES])
def test_generated_order_equals_torch(name: str, p: int, v: int, m: int) -> None:
    torch_or_skip()
    from tests.torch_reference import torch_order

    ours = _ours(name, p, v, m)
    try:
        theirs = torch_order(schedules.SCHEDULES[name].torch_class, p, v, m)
    except Exception:  # torch rejects these arguments
        theirs = None
    assert (ours is None) == (theirs is None), f"ours {'rejects' if ours is None else 'accepts'}, torch differs"
    assert ours == theirs


def test_torch_1f1b_pipeline_order_is_not_what_runs() -> None:
    """Documents why GPipe/1F1B ground truth is the executed order: torch's attribute misnumbers."""
    torch_or_skip()
    from torch.distributed.pipelining import schedules as ts

    from tests.torch_reference import _mock_stage, torch_order

    attr = ts.Schedule1F1B(_mock_stage(3, 4, 4), 8).pipeline_order[3]
    listed = [str(a) for a in attr if a is not None and a.computation_type.value in "FB"]
    assert listed[:2] == ["3F1", "3B0"]  # the bug: the last rank's first forward is listed as 3F1
    assert torch_order("1F1B", 4, 1, 8)[3][:2] == ["3F0", "3B0"]


@pytest.mark.parametrize(
    ("name", "p", "m"),
    [
        ("1f1b", 4, 8),
        ("interleaved-1f1b", 3, 6),
        ("interleaved-zb", 4, 8),
        ("zbv", 3, 5),
        ("dualpipev", 2, 6),
        ("looped-bfs", 2, 3),
        ("gpipe", 3, 4),
    ],
)
def test_csv_loads_in_torch_runtime(tmp_path, name: str, p: int, m: int) -> None:
    torch_or_skip()
    from tests.torch_reference import load_csv_in_torch

    sched = schedules.generate(name, p, m)
    path = tmp_path / "s.csv"
    path.write_text(schedules.to_csv(sched))
    assert load_csv_in_torch(str(path), p, sched.num_stages, m) == [[str(a) for a in r] for r in sched.order]


@pytest.mark.parametrize("name", list(schedules.SCHEDULES))
def test_csv_round_trip(name: str) -> None:
    sched = schedules.generate(name, 3, 6)
    again = schedules.from_order(schedules.parse_csv(schedules.to_csv(sched)), name=sched.name)
    assert again == sched


@pytest.mark.parametrize("name", list(schedules.SCHEDULES))
def test_action_names_and_csv_are_what_str_and_the_csv_module_write(name: str) -> None:
    # schedules.action_names skips str(Action) per action and to_csv joins the names: the same text.
    sched = schedules.generate(name, 4, 12)
    assert schedules.action_names(sched) == [[str(a) for a in rank] for rank in sched.order]
    buf = io.StringIO()
    csv.writer(buf, lineterminator="\n").writerows([str(a) for a in rank] for rank in sched.order)
    assert schedules.to_csv(sched) == buf.getvalue()


def test_golden_csv_interleaved_1f1b_4x8() -> None:
    sched = schedules.generate("interleaved-1f1b", 4, 8, 2)
    assert schedules.to_csv(sched) == (GOLDEN / "interleaved-1f1b-P4-V2-M8.csv").read_text()


def test_csv_overlapped_pairs_and_bubbles_are_read() -> None:
    order = schedules.parse_csv("0F0,,(0F1;1B0)OVERLAP_F_B\n")
    assert order == [[Action(0, "F", 0), Action(0, "F", 1), Action(1, "B", 0)]]


def test_csv_bad_cell_names_row_and_column() -> None:
    with pytest.raises(TfplanError, match=r"rank 1 \(row 2\), column 2: .*'0X1'"):
        schedules.parse_csv("0F0,0B0\n1F0,0X1\n")


def test_load_csv_checks_microbatches(tmp_path) -> None:
    path = tmp_path / "s.csv"
    path.write_text(schedules.to_csv(schedules.generate("gpipe", 2, 3)))
    assert schedules.load_csv(str(path)).num_microbatches == 3
    with pytest.raises(TfplanError, match="runs 3 micro-batches but --microbatches is 4"):
        schedules.load_csv(str(path), 4)
    with pytest.raises(TfplanError, match="not found"):
        schedules.load_csv(str(tmp_path / "missing.csv"))
    (tmp_path / "binary.csv").write_bytes(b"\xff\xfe0F0")
    with pytest.raises(TfplanError, match=r"binary\.csv: not a UTF-8 text file \(byte 0\)"):
        schedules.load_csv(str(tmp_path / "binary.csv"))


@pytest.mark.parametrize(
    ("name", "p", "m", "v", "message"),
    [
        ("nope", 2, 4, None, "unknown schedule 'nope'; known: gpipe, 1f1b"),
        ("1f1b", 4, 3, None, r"1f1b needs at least as many micro-batches as ranks \(4\), got 3"),
        ("gpipe", 2, 4, 2, "gpipe needs exactly 1 stages per rank, got 2"),
        ("interleaved-1f1b", 2, 4, 1, "needs >= 2 stages per rank, got 1"),
        ("interleaved-1f1b", 4, 9, 2, r"multiple of the rounds max\(1, M // P\) = 2"),
        ("zbv", 2, 4, 3, "zbv needs exactly 2 stages per rank, got 3"),
        ("dualpipev", 3, 5, None, r"at least as many micro-batches as stages \(6\), got 5"),
        ("1f1b", 2, 10**20, None, r"is up to 600,000,000,000,000,000,000 actions, over the 100,000,000"),
    ],
)
def test_arguments_a_schedule_cannot_run(name, p, m, v, message) -> None:
    with pytest.raises(TfplanError, match=message):
        schedules.generate(name, p, m, v)


def test_names_are_case_insensitive_and_accept_torch_class_names() -> None:
    assert schedules.get_spec("Interleaved1F1B").name == "interleaved-1f1b"
    assert schedules.get_spec("ZBVZeroBubble").name == "zbv"
    assert schedules.get_spec("GPIPE").name == "gpipe"


def test_v_placement() -> None:
    sched = schedules.generate("zbv", 3, 6)
    assert sched.stage_to_rank == (0, 1, 2, 2, 1, 0)
    assert schedules.generate("interleaved-1f1b", 3, 6).stage_to_rank == (0, 1, 2, 0, 1, 2)
