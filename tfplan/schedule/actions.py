"""Pipeline actions in torch.distributed.pipelining's grammar: ``"{stage}{kind}{microbatch}"``, and the rows of
torch's compute-only schedule CSV they fill (parse_csv).

Compute kinds: F (forward), B (full backward), I (input-gradient backward), W (weight-gradient backward).
A DualPipeV overlapped pair such as ``(0F7;7B3)OVERLAP_F_B`` is read as its two actions in order.

>>> parse_action("2F0")
Action(stage=2, kind='F', mb=0)
>>> str(Action(1, "W", 3))
'1W3'
"""

from __future__ import annotations

import csv
import io
import re
from typing import NamedTuple

from tfplan.errors import TfplanError

KINDS = ("F", "B", "I", "W")
# Kinds whose duration shrinks when parameters are frozen (METHOD.md section 3); F and I are fixed.
FREEZABLE = frozenset({"B", "W"})

_ACTION_RE = re.compile(r"^\s*(\d+)([FBIW])(\d+)\s*$")
_OVERLAP_RE = re.compile(r"^\s*\((.*)\)\s*OVERLAP_F_B\s*$")


class Action(NamedTuple):
    """One compute action of one micro-batch on one stage."""

    stage: int
    kind: str  # one of KINDS
    mb: int

    def __str__(self) -> str:
        return f"{self.stage}{self.kind}{self.mb}"


def parse_action(text: str) -> Action:
    """Parse one compute action such as ``"2B5"``.

    Raises:
        TfplanError: the text is not a compute action in torch's grammar.
    """
    match = _ACTION_RE.match(text)
    if match is None:
        raise TfplanError(f"not a compute action in torch's grammar (e.g. 2F0, 1W3): {text!r}")
    stage, kind, mb = match.groups()
    return Action(int(stage), kind, int(mb))


def parse_cell(text: str) -> list[Action]:
    """Parse one schedule cell: empty (a bubble), one action, or a DualPipeV overlapped pair.

    >>> parse_cell("(0F7;7B3)OVERLAP_F_B")
    [Action(stage=0, kind='F', mb=7), Action(stage=7, kind='B', mb=3)]
    >>> parse_cell("")
    []
    """
    text = text.strip()
    if not text:
        return []
    overlap = _OVERLAP_RE.match(text)
    if overlap is not None:
        return [parse_action(part) for part in overlap.group(1).split(";") if part.strip()]
    return [parse_action(text)]


def parse_csv(text: str, source: str = "schedule CSV") -> list[list[Action]]:
    """Parse torch's compute-only CSV (empty cells are bubbles; overlapped pairs are expanded).

    Raises:
        TfplanError: naming the row (rank) and column of a cell that is not a compute action.
    """
    order = []
    for rank, row in enumerate(csv.reader(io.StringIO(text))):
        actions = []
        for col, cell in enumerate(row):
            try:
                actions.extend(parse_cell(cell))
            except TfplanError as exc:
                raise TfplanError(f"{source}: rank {rank} (row {rank + 1}), column {col + 1}: {exc}") from None
        order.append(actions)
    while order and not order[-1]:
        order.pop()  # trailing blank lines
    if not order:
        raise TfplanError(f"{source}: no rows")
    return order
