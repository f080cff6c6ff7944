"""Schedule validator: every generated or loaded schedule passes here before it is used.

Checks, in order: actions in range; each stage on exactly one rank (and the expected one, when given);
each (stage, micro-batch) has exactly one F and either one B or one I+W pair; F before B/I and I before W;
adjacent stages on different ranks exchange micro-batches in the same order (point-to-point messages
between two ranks match in the order they are posted, so a mismatch hangs or mixes up activations).
A violation is reported as a TfplanError: one line, then the rank x step grid with the bad cell marked.
"""

from __future__ import annotations

from collections.abc import Sequence

from tfplan.errors import TfplanError
from tfplan.schedule.actions import Action

_WINDOW = 10  # steps shown either side of the bad cell in long schedules
_NEEDS = {"B": "F", "I": "F", "W": "I"}  # the action of the same stage and micro-batch that must come first


def format_grid(order: Sequence[Sequence[Action]], mark: tuple[int, int] | None = None) -> str:
    """Render the rank x step grid; the cell `mark` = (rank, step) is shown as ``>2B5<``.

    >>> print(format_grid([[Action(0, "F", 0), Action(0, "B", 0)]], mark=(0, 1)))
    step       0    1
    rank 0  0F0 >0B0<
    """
    length = max((len(r) for r in order), default=0)
    lo, hi = 0, length
    if mark is not None and length > 2 * _WINDOW + 1:
        lo, hi = max(0, mark[1] - _WINDOW), min(length, mark[1] + _WINDOW + 1)
    elif mark is None and length > 4 * _WINDOW:
        hi = 4 * _WINDOW
    width = max([len(str(a)) for r in order for a in r[lo:hi]] + [3]) + 2
    lines = ["step   " + "".join(f"{i:>{width}}" for i in range(lo, hi))]
    for rank, actions in enumerate(order):
        cells = []
        for step in range(lo, hi):
            text = str(actions[step]) if step < len(actions) else ""
            if mark == (rank, step):
                text = f">{text}<"
                cells.append(f"{text:>{width}}")
            else:
                cells.append(f"{text:>{width - 1}} ")
        lines.append(f"rank {rank:<2}" + "".join(cells).rstrip())
    if lo > 0 or hi < length:
        lines.append(f"(steps {lo}..{hi - 1} of {length} shown)")
    return "\n".join(lines)


def _fail(order: Sequence[Sequence[Action]], message: str, mark: tuple[int, int] | None = None) -> None:
    raise TfplanError(f"invalid schedule: {message}\n{format_grid(order, mark)}")


def infer_stage_to_rank(order: Sequence[Sequence[Action]], num_stages: int) -> tuple[int, ...]:
    """Which rank runs each stage (the schedule must already be valid)."""
    mapping = [-1] * num_stages
    for rank, actions in enumerate(order):
        for a in actions:
            mapping[a.stage] = rank
    assert all(r >= 0 for r in mapping), "every stage runs somewhere in a valid schedule"
    return tuple(mapping)


def check_order(
    order: Sequence[Sequence[Action]],
    num_stages: int,
    num_microbatches: int,
    expected_stage_to_rank: Sequence[int] | None = None,
) -> None:
    """Validate a per-rank compute order.

    Raises:
        TfplanError: the first violation found, with the grid and the bad cell marked.
    """
    owner = _owners_if_valid(order, num_stages, num_microbatches, expected_stage_to_rank)
    if owner is None:  # something is wrong: the loop below finds the first violation and names it
        _check_each_action(order, num_stages, num_microbatches, expected_stage_to_rank)
        raise AssertionError("_owners_if_valid rejected an order that every per-action check accepts")
    _check_microbatch_order(order, num_stages, owner)


def _owners_if_valid(
    order: Sequence[Sequence[Action]],
    num_stages: int,
    num_microbatches: int,
    expected_stage_to_rank: Sequence[int] | None,
) -> dict[int, int] | None:
    """The per-action checks of _check_each_action as set and dict comprehensions (several times faster: a
    million-action schedule is validated in well under a second): stage -> rank when all of them hold, else None.

    Counting replaces the search for missing actions: with every action in range, none twice and no stage on two
    ranks, every (stage, micro-batch) has its F when there are S M of them, and one B or one I + W pair when no
    pair has both B and I, every W follows its I, and |B| + |I| = |W| + |B| = S M.
    """
    owner: dict[int, int] = {}
    kinds = {"F": 0, "B": 0, "I": 0, "W": 0}
    for rank, actions in enumerate(order):
        if not actions:
            return None
        stages = {a[0] for a in actions}
        mbs = {a[2] for a in actions}
        if min(stages) < 0 or max(stages) >= num_stages or min(mbs) < 0 or max(mbs) >= num_microbatches:
            return None
        if any(s in owner for s in stages):
            return None
        if expected_stage_to_rank is not None and any(expected_stage_to_rank[s] != rank for s in stages):
            return None
        owner.update(dict.fromkeys(stages, rank))
        step = {a: i for i, a in enumerate(actions)}  # Actions hash as their tuples
        if len(step) != len(actions):
            return None  # an action twice on one rank (on two ranks, its stage would be on both)
        get = step.get
        if any(get((s, _NEEDS[k], m), i) >= i for i, (s, k, m) in enumerate(actions) if k != "F"):
            return None  # a B or I before its F, a W before its I (or without it)
        if any((s, "I", m) in step for s, k, m in actions if k == "B"):
            return None
        for a in actions:
            kinds[a[1]] += 1
    cells = num_stages * num_microbatches
    if kinds["F"] != cells or kinds["B"] + kinds["I"] != cells or kinds["W"] != kinds["I"]:
        return None
    return owner


def _check_each_action(
    order: Sequence[Sequence[Action]],
    num_stages: int,
    num_microbatches: int,
    expected_stage_to_rank: Sequence[int] | None,
) -> None:
    """check_order's checks one action at a time, in order: the first violation raises, with its cell marked."""
    where: dict[Action, tuple[int, int]] = {}
    owner: dict[int, int] = {}
    for rank, actions in enumerate(order):
        if not actions:
            _fail(order, f"rank {rank} has no actions")
        for step, a in enumerate(actions):
            cell = (rank, step)
            if not 0 <= a.stage < num_stages:
                _fail(order, f"rank {rank}, step {step}: {a} names stage {a.stage}, not in 0..{num_stages - 1}", cell)
            if not 0 <= a.mb < num_microbatches:
                _fail(
                    order,
                    f"rank {rank}, step {step}: {a} names micro-batch {a.mb}, not in 0..{num_microbatches - 1}",
                    cell,
                )
            if owner.setdefault(a.stage, rank) != rank:
                _fail(order, f"rank {rank}, step {step}: stage {a.stage} also runs on rank {owner[a.stage]}", cell)
            if expected_stage_to_rank is not None and expected_stage_to_rank[a.stage] != rank:
                _fail(
                    order,
                    f"rank {rank}, step {step}: stage {a.stage} belongs on rank {expected_stage_to_rank[a.stage]}",
                    cell,
                )
            if a in where:
                _fail(order, f"rank {rank}, step {step}: {a} appears twice (first at step {where[a][1]})", cell)
            where[a] = cell
            _check_dependencies(order, a, cell, where)

    for s in range(num_stages):
        for m in range(num_microbatches):
            if (s, "F", m) not in where:
                _fail(order, f"stage {s}, micro-batch {m} has no forward ({s}F{m})")
            has_b = (s, "B", m) in where
            has_i, has_w = (s, "I", m) in where, (s, "W", m) in where
            if not has_b and not (has_i or has_w):
                _fail(order, f"stage {s}, micro-batch {m} has no backward ({s}B{m} or {s}I{m} + {s}W{m})")
            if has_i and not has_w:
                _fail(order, f"stage {s}, micro-batch {m} has {s}I{m} but no {s}W{m}", where[Action(s, "I", m)])


def _check_dependencies(
    order: Sequence[Sequence[Action]], a: Action, cell: tuple[int, int], seen: dict[Action, tuple[int, int]]
) -> None:
    """Within a stage (one rank, so list order is time order): F before B/I, I before W, not B and I/W."""
    # Plain tuples as keys: an Action is a NamedTuple, equal to (and hashed as) its tuple, and building one
    # costs several times more (this runs once per action, a million times for the largest schedules).
    rank, step = cell
    s, kind, m = a
    if kind == "F":
        return
    if kind in ("B", "I") and (s, "F", m) not in seen:
        _fail(order, f"rank {rank}, step {step}: {a} runs before its forward {s}F{m}", cell)
    if kind == "W" and (s, "I", m) not in seen:
        _fail(order, f"rank {rank}, step {step}: {a} runs before its input-gradient step {s}I{m}", cell)
    if kind == "B" and ((s, "I", m) in seen or (s, "W", m) in seen):
        _fail(order, f"rank {rank}, step {step}: {a} duplicates the split backward {s}I{m}/{s}W{m}", cell)
    if kind == "I" and (s, "B", m) in seen:
        _fail(order, f"rank {rank}, step {step}: {a} duplicates the full backward {s}B{m}", cell)


def _check_microbatch_order(
    order: Sequence[Sequence[Action]],
    num_stages: int,
    owner: dict[int, int],
) -> None:
    """Adjacent stages on different ranks must send and receive micro-batches in the same order."""
    fwd: dict[int, list[Action]] = {s: [] for s in range(num_stages)}
    bwd: dict[int, list[Action]] = {s: [] for s in range(num_stages)}
    for actions in order:
        for a in actions:
            kind = a[1]  # tuple indexing: cheaper than the attributes, a million times over
            if kind == "F":
                fwd[a[0]].append(a)
            elif kind == "B" or kind == "I":
                bwd[a[0]].append(a)
    for s in range(num_stages - 1):
        if owner[s] == owner[s + 1]:
            continue  # same rank: handed over locally, no message order to match
        for sender, receiver, what in ((fwd[s], fwd[s + 1], "forward"), (bwd[s + 1], bwd[s], "backward")):
            if [a[2] for a in sender] == [a[2] for a in receiver]:
                continue
            for sent, got in zip(sender, receiver, strict=True):
                if sent.mb != got.mb:
                    _fail(
                        order,
                        f"stage {got.stage} receives {what} micro-batch {got.mb} ({got}) while stage "
                        f"{sent.stage} sends micro-batch {sent.mb} ({sent}) at that point: adjacent stages on "
                        f"different ranks must exchange micro-batches in the same order",
                        (owner[got.stage], order[owner[got.stage]].index(got)),
                    )
