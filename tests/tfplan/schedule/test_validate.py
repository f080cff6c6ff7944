"""Schedule validator: every violation kind raises a TfplanError whose first line names the problem and whose
grid marks the bad cell; every generated schedule validates; long schedules show a window around the cell."""

from __future__ import annotations

import re

import pytest
from hypothesis import assume, given, settings
from hypothesis import strategies as st

from tfplan.errors import TfplanError
from tfplan.schedule import schedules
from tfplan.schedule.actions import Action, parse_action
from tfplan.schedule.validate import check_order, format_grid, infer_stage_to_rank


def _order(*ranks: str) -> list[list[Action]]:
    """'0F0 0B0' per rank -> per-rank action lists."""
    return [[parse_action(a) for a in rank.split()] for rank in ranks]


def _error(order, num_stages: int, num_microbatches: int, expected=None) -> tuple[str, list[str]]:
    with pytest.raises(TfplanError) as info:
        check_order(order, num_stages, num_microbatches, expected_stage_to_rank=expected)
    first, *grid = str(info.value).split("\n")
    assert first.startswith("invalid schedule: ")
    assert grid and grid[0].startswith("step"), "the rank x step grid follows the first line"
    return first, grid


def _marked(grid: list[str]) -> list[tuple[int, str]]:
    """(rank, action) of every >marked< cell in the grid."""
    out = []
    for line in grid:
        m = re.match(r"rank (\d+)", line)
        if m:
            out += [(int(m.group(1)), cell) for cell in re.findall(r">(\w*)<", line)]
    return out


# (name, per-rank order, stages, micro-batches, expected placement, first-line pattern, marked (rank, action))
VIOLATIONS = [
    ("stage out of range", _order("0F0 0B0 5F0"), 2, 1, None, r"5F0 names stage 5, not in 0\.\.1", (0, "5F0")),
    ("mb out of range", _order("0F0 0B0 0F3"), 1, 2, None, r"0F3 names micro-batch 3, not in 0\.\.1", (0, "0F3")),
    ("stage on two ranks", _order("0F0 0B0", "0F1 0B1"), 1, 2, None, r"stage 0 also runs on rank 0", (1, "0F1")),
    ("wrong rank", _order("0F0 0B0 1F0 1B0"), 2, 1, (0, 1), r"rank 0, step 2: stage 1 belongs on rank 1", (0, "1F0")),
    ("duplicate", _order("0F0 0F0 0B0"), 1, 1, None, r"0F0 appears twice \(first at step 0\)", (0, "0F0")),
    ("B after I/W", _order("0F0 0I0 0W0 0B0"), 1, 1, None, r"0B0 duplicates the split backward 0I0/0W0", (0, "0B0")),
    ("I after B", _order("0F0 0B0 0I0 0W0"), 1, 1, None, r"0I0 duplicates the full backward 0B0", (0, "0I0")),
    ("W then B", _order("0F0 0I0 0W0 0F1 0B1 0W1"), 1, 2, None, r"0W1 runs before its input-gradient", (0, "0W1")),
    ("B before F", _order("0B0 0F0"), 1, 1, None, r"0B0 runs before its forward 0F0", (0, "0B0")),
    ("I before F", _order("0I0 0F0 0W0"), 1, 1, None, r"0I0 runs before its forward 0F0", (0, "0I0")),
    ("W before I", _order("0F0 0W0 0I0"), 1, 1, None, r"0W0 runs before its input-gradient step 0I0", (0, "0W0")),
    ("I without W", _order("0F0 0I0"), 1, 1, None, r"stage 0, micro-batch 0 has 0I0 but no 0W0", (0, "0I0")),
    (
        "forward mb order",
        _order("0F0 0F1 0B0 0B1", "1F1 1F0 1B0 1B1"),
        2,
        2,
        None,
        r"stage 1 receives forward micro-batch 1 \(1F1\) while stage 0 sends micro-batch 0",
        (1, "1F1"),
    ),
    (
        "backward mb order",
        _order("0F0 0F1 0B1 0B0", "1F0 1F1 1B0 1B1"),
        2,
        2,
        None,
        r"stage 0 receives backward micro-batch 1 \(0B1\) while stage 1 sends micro-batch 0",
        (0, "0B1"),
    ),
]


@pytest.mark.parametrize(
    ("order", "num_stages", "m", "expected", "pattern", "mark"),
    [v[1:] for v in VIOLATIONS],
    ids=[v[0] for v in VIOLATIONS],
)
def test_violation_names_problem_and_marks_cell(order, num_stages, m, expected, pattern, mark) -> None:
    first, grid = _error(order, num_stages, m, expected)
    assert re.search(pattern, first), first
    assert _marked(grid) == [mark]
    # The grid lists every rank, and every unmarked action of it.
    rank_lines = [line for line in grid if line.startswith("rank")]
    assert len(rank_lines) == len(order)
    for line, actions in zip(rank_lines, order):
        shown = re.findall(r"\d+[FBIW]\d+", line)
        assert shown == [str(a) for a in actions]


def test_missing_forward_names_the_action() -> None:
    first, grid = _error(_order("0F0 0B0"), 1, 2)  # micro-batch 1 never runs
    assert "stage 0, micro-batch 1 has no forward (0F1)" in first
    assert _marked(grid) == []  # nothing to mark: the action is absent


def test_missing_backward_names_both_alternatives() -> None:
    first, _ = _error(_order("0F0 0F1 0B0"), 1, 2)
    assert "stage 0, micro-batch 1 has no backward (0B1 or 0I1 + 0W1)" in first


def test_empty_rank() -> None:
    first, grid = _error(_order("0F0 0B0", "", "1F0 1B0"), 2, 1)
    assert "rank 1 has no actions" in first
    assert sum(line.startswith("rank") for line in grid) == 3


def test_same_rank_adjacent_stages_may_interleave_micro_batches() -> None:
    # Stages 0 and 1 both on rank 0: handed over locally, so no message order to match.
    check_order(_order("0F0 0F1 1F1 1F0 1B0 1B1 0B1 0B0"), 2, 2)


def test_valid_small_schedules_pass() -> None:
    check_order(_order("0F0 0F1 0B0 0B1", "1F0 1B0 1F1 1B1"), 2, 2)
    check_order(_order("0F0 0I0 0W0"), 1, 1)
    check_order(_order("0F0 0F1 0I0 0B1 0W0"), 1, 2)  # B for one micro-batch, I + W for the other


def _spv(spec: schedules.ScheduleSpec) -> list[int]:
    hi = spec.max_stages_per_rank if spec.max_stages_per_rank is not None else 3
    return list(range(spec.min_stages_per_rank, hi + 1))


GENERATED = [
    (name, p, v, m)
    for name, spec in schedules.SCHEDULES.items()
    for v in _spv(spec)
    for p in (1, 2, 3, 4)
    for m in (1, 2, 3, 5, 6, 8)
]


@pytest.mark.parametrize(("name", "p", "v", "m"), GENERATED, ids=[f"{n}-P{p}-V{v}-M{m}" for n, p, v, m in GENERATED])
def test_every_generated_schedule_validates(name: str, p: int, v: int, m: int) -> None:
    try:
        sched = schedules.generate(name, p, m, v)
    except TfplanError as exc:
        # Only argument checks may refuse; never an invalid generated order.
        assert not str(exc).startswith("invalid schedule"), str(exc)
        return
    spec = schedules.SCHEDULES[name]
    mapping = schedules.stage_to_rank(spec.placement, p, p * v)
    check_order(sched.order, p * v, m, expected_stage_to_rank=mapping)
    assert infer_stage_to_rank(sched.order, p * v) == mapping
    # Exactly one F and one B (or one I + one W) per (stage, micro-batch).
    actions = [a for rank in sched.order for a in rank]
    assert len(actions) == len(set(actions))
    for s in range(p * v):
        for mb in range(m):
            assert Action(s, "F", mb) in actions
            split = Action(s, "I", mb) in actions
            assert split == (Action(s, "W", mb) in actions)
            assert split != (Action(s, "B", mb) in actions)


def test_long_schedule_shows_a_window_around_the_bad_cell() -> None:
    sched = schedules.generate("gpipe", 2, 30)
    order = [list(rank) for rank in sched.order]
    order[1][40], order[1][41] = order[1][41], order[1][40]  # 1B10 <-> 1B11: out of order with rank 0
    first, grid = _error(order, 2, 30)
    assert "stage 0 receives backward micro-batch 10 (0B10) while stage 1 sends micro-batch 11" in first
    assert _marked(grid) == [(0, "0B10")]
    header = grid[0].split()[1:]
    steps = [int(x) for x in header]
    assert steps == list(range(30, 51)), "10 steps either side of the bad cell"
    assert grid[-1] == "(steps 30..50 of 60 shown)"
    assert "0F0" not in "\n".join(grid)  # far-away cells are not printed


def test_format_grid_marks_and_pads() -> None:
    text = format_grid(_order("0F0 0B0", "1F0"), mark=(1, 0))
    lines = text.split("\n")
    assert lines[0].split() == ["step", "0", "1"]
    assert lines[1].split() == ["rank", "0", "0F0", "0B0"]
    assert lines[2].split() == ["rank", "1", ">1F0<"]
    # Columns line up: the marks sit around the action, which stays in the same columns as unmarked ones.
    assert lines[1].index("0F0") == lines[2].index("1F0")


MUTATIONS = ("swap", "drop", "duplicate", "move rank", "rename stage", "rename mb", "rename kind")


@settings(max_examples=300, deadline=None)
@given(
    name=st.sampled_from(list(schedules.SCHEDULES)),
    p=st.integers(1, 3),
    m=st.integers(1, 6),
    edits=st.lists(st.tuples(st.sampled_from(MUTATIONS), st.integers(0, 10_000), st.integers(0, 10_000)),
                   max_size=2),
)
def test_the_fast_checks_accept_exactly_what_the_per_action_checks_accept(name, p, m, edits) -> None:
    # check_order first runs _owners_if_valid (comprehensions and counts) and walks the actions one by one only
    # when it fails, to name the first violation: the two must agree on every order, valid or broken.
    from tfplan.schedule.validate import _check_each_action, _owners_if_valid

    try:
        sched = schedules.generate(name, p, m)
    except TfplanError:
        assume(False)
    order = [list(rank) for rank in sched.order]
    for edit, i, j in edits:
        rank = order[i % len(order)]
        if not rank:
            continue
        k, a = j % len(rank), rank[j % len(rank)]
        if edit == "swap":
            rank[k], rank[i % len(rank)] = rank[i % len(rank)], rank[k]
        elif edit == "drop":
            del rank[k]
        elif edit == "duplicate":
            rank.insert(i % (len(rank) + 1), a)
        elif edit == "move rank":
            del rank[k]
            order[j % len(order)].insert(i % (len(order[j % len(order)]) + 1), a)
        elif edit == "rename stage":
            rank[k] = Action(i % (sched.num_stages + 1), a.kind, a.mb)
        elif edit == "rename mb":
            rank[k] = Action(a.stage, a.kind, i % (m + 1))
        else:
            rank[k] = Action(a.stage, "FBIW"[i % 4], a.mb)
    expected = sched.stage_to_rank if edits and edits[0][1] % 2 else None
    fast = _owners_if_valid(order, sched.num_stages, m, expected) is not None
    try:
        _check_each_action(order, sched.num_stages, m, expected)
        slow = True
    except TfplanError:
        slow = False
    assert fast == slow
