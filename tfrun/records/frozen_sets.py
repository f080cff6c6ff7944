"""frozen_sets.jsonl: what every (stage, micro-batch) action of every step froze, as the run realised it, so that
`tfrun retime` can run the same work again beside other runs (tfrun.retime Note [paired time]).

The first line names each stage's tensors, {"schema_version": 1, "tensors": [[name, ...] per stage]}; then one line
a step, {"step": n, "frozen": [[[index, ...] per micro-batch] per stage]}, indices into that stage's names. A
resumed run keeps the lines of the steps before it and appends from there, as metrics.jsonl does. No torch.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path

from tfplan.fileio import write_text_atomic
from tfrun.errors import TfrunError

FILE = "frozen_sets.jsonl"
SCHEMA_VERSION = 1


class FrozenSetsLog:
    """Rank 0's writer: afresh (atomically) with the header and the kept steps' lines, then a line per step."""

    def __init__(self, out: Path, tensors: list[list[str]], start: int) -> None:
        self.path, self.stages = out / FILE, len(tensors)
        kept: list[str] = []
        if start > 0 and self.path.exists():  # a resume: the steps before it, as the checkpoint left them
            kept = [line for line in self.path.read_text().splitlines()[1:] if _step(line, start) < start]
        header = json.dumps({"schema_version": SCHEMA_VERSION, "tensors": tensors})
        out.mkdir(parents=True, exist_ok=True)
        write_text_atomic(self.path, "".join(line + "\n" for line in [header, *kept]))

    def append(self, step: int, frozen: dict[tuple[int, int], list[int]], num_microbatches: int) -> None:
        """One step's realised sets: (stage, micro-batch) -> the frozen tensors' indices into the header's names,
        ascending (absent: nothing frozen)."""
        rows = [[frozen.get((s, mb), []) for mb in range(num_microbatches)] for s in range(self.stages)]
        with self.path.open("a") as f:
            f.write(json.dumps({"step": step, "frozen": rows}) + "\n")


def _step(line: str, default: int) -> int:
    """A line's step; `default` for a line that is not one (a kill during the append leaves a partial last line)."""
    try:
        return int(json.loads(line)["step"])
    except (ValueError, KeyError, TypeError):
        return default


@dataclass(frozen=True, slots=True)
class FrozenSets:
    """A run's frozen_sets.jsonl, read."""

    tensors: list[list[str]]
    steps: dict[int, list[list[frozenset[str]]]]
    """step -> per stage, per micro-batch, the frozen names."""


def load(run_dir: str | Path) -> FrozenSets:
    """Read and check RUN/frozen_sets.jsonl; a missing or malformed file is one TfrunError line naming it."""
    path = Path(run_dir) / FILE
    if not path.exists():
        raise TfrunError(f"{path} does not exist: the run was written before tfrun recorded its frozen sets; "
                         "train it again to re-time it")
    lines = [line for line in path.read_text().splitlines() if line.strip()]
    try:
        header = json.loads(lines[0]) if lines else {}
        if header.get("schema_version") != SCHEMA_VERSION:
            raise ValueError(f"schema_version is {header.get('schema_version')!r}, expected {SCHEMA_VERSION}")
        tensors = header["tensors"]
        if not (isinstance(tensors, list) and all(isinstance(t, list) for t in tensors)):
            raise ValueError("tensors is not a list of lists of names")
        steps: dict[int, list[list[frozenset[str]]]] = {}
        for number, line in enumerate(lines[1:], start=2):
            row = json.loads(line)
            frozen = row["frozen"]
            if len(frozen) != len(tensors):
                raise ValueError(f"line {number}: frozen has {len(frozen)} stages, the header {len(tensors)}")
            if any(not isinstance(i, int) or not 0 <= i < len(tensors[s]) for s, stage in enumerate(frozen)
                   for mb in stage for i in mb):
                raise ValueError(f"line {number}: an index is not one of its stage's tensors")
            steps[int(row["step"])] = [[frozenset(tensors[s][i] for i in mb) for mb in stage]
                                       for s, stage in enumerate(frozen)]
    except (ValueError, KeyError, IndexError, TypeError) as exc:
        raise TfrunError(f"{path} is malformed: {exc}") from None
    return FrozenSets(tensors=tensors, steps=steps)
