"""tfrun.records.frozen_sets: what a run froze, written a step at a time, kept across a resume, and read back; a
missing or malformed file is one line naming it."""

from __future__ import annotations

import json

import pytest

from tfrun.errors import TfrunError
from tfrun.records import frozen_sets

TENSORS = [["embed.weight", "norm.weight"], ["head.weight"]]


def _write(out, steps: range, start: int = 0) -> None:
    log = frozen_sets.FrozenSetsLog(out, TENSORS, start)
    for step in steps:
        log.append(step, {(0, 1): [0, 1], (1, 0): [0]} if step % 2 else {}, num_microbatches=2)


def test_written_sets_read_back_per_step_stage_and_microbatch(tmp_path) -> None:
    _write(tmp_path, range(4))
    got = frozen_sets.load(tmp_path)
    assert got.tensors == TENSORS and sorted(got.steps) == [0, 1, 2, 3]
    assert got.steps[1] == [[frozenset(), frozenset(TENSORS[0])], [frozenset({"head.weight"}), frozenset()]]
    assert got.steps[2] == [[frozenset(), frozenset()], [frozenset(), frozenset()]]
    row = json.loads((tmp_path / frozen_sets.FILE).read_text().splitlines()[2])
    assert row == {"step": 1, "frozen": [[[], [0, 1]], [[0], []]]}  # indices into the header's names


def test_a_resume_keeps_the_steps_before_it_and_appends(tmp_path) -> None:
    _write(tmp_path, range(6))  # the run got to step 5, its checkpoint is at step 3, and it was killed mid-append
    with (tmp_path / frozen_sets.FILE).open("a") as f:
        f.write('{"step": 6, "froz')
    _write(tmp_path, range(3, 5), start=3)
    assert sorted(frozen_sets.load(tmp_path).steps) == [0, 1, 2, 3, 4]


@pytest.mark.parametrize("text,expect", [
    (None, "does not exist: the run was written before tfrun recorded its frozen sets"),
    ('{"schema_version": 9, "tensors": []}\n', "schema_version is 9, expected 1"),
    ('{"schema_version": 1, "tensors": [["a"]]}\n{"step": 0, "frozen": [[], []]}\n', "line 2: frozen has 2 stages"),
    ('{"schema_version": 1, "tensors": [["a"]]}\n{"step": 0, "frozen": [[[3]]]}\n', "line 2: an index is not"),
    ('{"schema_version": 1, "tensors": [["a"]]}\n{"step": 0, "frozen": [[[-1]]]}\n', "line 2: an index is not"),
    ("not json\n", "malformed"),
])
def test_a_missing_or_malformed_file_is_one_line(tmp_path, text, expect) -> None:
    if text is not None:
        (tmp_path / frozen_sets.FILE).write_text(text)
    with pytest.raises(TfrunError, match=expect.replace("(", r"\(")) as info:
        frozen_sets.load(tmp_path)
    assert "\n" not in str(info.value)
