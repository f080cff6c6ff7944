"""Checkpoints (tfrun.records.checkpoint): the commit order (rank files, index with sizes and sha256, latest.json), the
choice a resume makes (the newest checkpoint that verifies, with a warning for each one skipped), pruning,
a full disk, and the index validator under fuzzing. One-rank gloo group in-process; no torchrun."""

from __future__ import annotations

import errno
import hashlib
import json
import os
import stat
from pathlib import Path

import pytest
from hypothesis import given, settings

from tests.conftest import torch_or_skip
from tests.fuzzing import json_values, mutated

torch = torch_or_skip()

from tfrun.errors import TfrunError  # noqa: E402
from tfrun.records import checkpoint  # noqa: E402


class _State:
    """Stands in for Batches / Freezer: anything with state_dict and load_state_dict."""

    def __init__(self, value: int) -> None:
        self.value = value

    def state_dict(self) -> dict:
        return {"value": self.value}

    def load_state_dict(self, state: dict) -> None:
        self.value = state["value"]


@pytest.fixture
def group(single_rank_group):
    return None


def _save(out: Path, step: int, keep: int = 0, seed: int = 0) -> dict:
    torch.manual_seed(seed + step)
    module = torch.nn.Linear(4, 3)
    opt = torch.optim.AdamW(module.parameters(), lr=0.1)
    module(torch.randn(2, 4)).sum().backward()
    opt.step()
    checkpoint.save(out, 0, step, {0: module}, opt, _State(step), _State(-step), [{"step": step - 1}],
                    run={"lr": 0.1}, keep=keep)
    return module.state_dict()


def test_save_commits_files_index_then_latest_and_load_restores(group, tmp_path) -> None:
    weights = _save(tmp_path, 3)
    folder = checkpoint.folder(tmp_path, 3)
    index = json.loads((folder / "index.json").read_text())
    data = (folder / "rank0.pt").read_bytes()
    assert index["files"] == {"rank0.pt": {"bytes": len(data), "sha256": hashlib.sha256(data).hexdigest()}}
    assert index["run"] == {"lr": 0.1} and index["world_size"] == 1
    assert json.loads((tmp_path / "checkpoints" / "latest.json").read_text()) == {"step": 3, "world_size": 1}
    assert sorted(p.name for p in folder.iterdir()) == ["index.json", "rank0.pt"]  # no temp files
    module = torch.nn.Linear(4, 3)
    batches, freezer = _State(0), _State(0)
    step, metrics = checkpoint.load(tmp_path, 0, {0: module}, torch.optim.AdamW(module.parameters()), batches,
                                    freezer, step=3)
    assert step == 3 and metrics == [{"step": 2}] and (batches.value, freezer.value) == (3, -3)
    assert all(torch.equal(module.state_dict()[k], v) for k, v in weights.items())


def test_a_full_disk_is_one_line_and_the_previous_checkpoint_stays_latest(group, tmp_path, monkeypatch) -> None:
    _save(tmp_path, 2)

    def full(obj, stream):
        stream.write(b"partial")
        raise OSError(errno.ENOSPC, "No space left on device")

    monkeypatch.setattr(torch, "save", full)
    with pytest.raises(TfrunError, match=r"^cannot write checkpoint file .*rank0\.pt: No space left on device$"):
        _save(tmp_path, 4)
    assert json.loads((tmp_path / "checkpoints" / "latest.json").read_text())["step"] == 2
    assert list(checkpoint.folder(tmp_path, 4).iterdir()) == []  # no index, no temp file: never chosen
    assert checkpoint.choose(tmp_path, 1)[0] == 2


def test_pruning_keeps_the_newest_complete_ones(group, tmp_path) -> None:
    for step in (2, 4, 6):
        _save(tmp_path, step)
    checkpoint.folder(tmp_path, 5).mkdir()  # an incomplete one (a crash mid-save)
    _save(tmp_path, 8, keep=2)
    assert sorted(p.name for p in (tmp_path / "checkpoints").iterdir()) == ["latest.json", "step0000006",
                                                                             "step0000008"]
    _save(tmp_path, 10, keep=0)  # keep all
    _save(tmp_path, 4, keep=0)  # a resumed run re-saving step 4 abandons the newer ones
    assert [s for s, _ in checkpoint._step_folders(tmp_path)] == [4]


@pytest.fixture
def three(group, tmp_path) -> Path:
    for step in (2, 4, 6):
        _save(tmp_path, step)
    return tmp_path


def test_a_resume_takes_the_newest_checkpoint_that_verifies(three) -> None:
    assert checkpoint.choose(three, 1) == (6, {"lr": 0.1}, [])
    rank_file = checkpoint.folder(three, 6) / "rank0.pt"
    data = rank_file.read_bytes()
    rank_file.write_bytes(data[: len(data) // 2])  # truncated
    step, _, warnings = checkpoint.choose(three, 1)
    assert step == 4 and len(warnings) == 1
    assert warnings[0] == (f"checkpoint step 6 is unusable: rank0.pt has {len(data) // 2} bytes, the index says "
                           f"{len(data)} (truncated or rewritten); resuming from step 4")
    flipped = bytearray((checkpoint.folder(three, 4) / "rank0.pt").read_bytes())
    flipped[100] ^= 1
    (checkpoint.folder(three, 4) / "rank0.pt").write_bytes(bytes(flipped))  # same size, other bytes
    step, _, warnings = checkpoint.choose(three, 1)
    assert step == 2 and "rank0.pt does not match its sha256 (corrupted)" in warnings[1]


def test_a_missing_or_wrong_latest_json_is_a_warning(three) -> None:
    latest = three / "checkpoints" / "latest.json"
    latest.write_text(json.dumps({"step": 8, "world_size": 1}))
    assert checkpoint.choose(three, 1)[2] == ["checkpoints/latest.json names step 8, which is not a complete "
                                              "checkpoint; resuming from step 6"]
    latest.unlink()
    step, _, warnings = checkpoint.choose(three, 1)
    assert step == 6 and "latest.json is missing or unreadable" in warnings[0]
    checkpoint.folder(three, 7).mkdir()
    assert "checkpoint step 7 is incomplete (its save did not finish)" in checkpoint.choose(three, 1)[2][0]


def test_no_usable_checkpoint_or_another_world_size_is_an_error(three) -> None:
    with pytest.raises(TfrunError, match="checkpoint step 6 was written by 1 ranks, this job has 2"):
        checkpoint.choose(three, 2)
    for step in (2, 4, 6):
        (checkpoint.folder(three, step) / "rank0.pt").unlink()
    with pytest.raises(TfrunError, match=r"no usable checkpoint \(checkpoint step 6 is unusable: rank0\.pt is "
                                         r"missing; checkpoint step 4"):
        checkpoint.choose(three, 1)


def test_a_checkpoint_from_before_indexes_is_used_unverified(three) -> None:
    (checkpoint.folder(three, 6) / "index.json").unlink()
    step, run, warnings = checkpoint.choose(three, 1)
    assert (step, run) == (6, {}) and "has no index (written by an older tfrun)" in warnings[0]


INDEX = {"schema_version": 1, "step": 2, "world_size": 2, "time": 0.0, "run": {"lr": 0.1},
         "files": {f"rank{r}.pt": {"bytes": 10, "sha256": "0" * 64} for r in range(2)}}


def test_index_damage_names_the_field() -> None:
    assert checkpoint.index_from_dict(INDEX) is INDEX
    with pytest.raises(TfrunError, match=r"^index\.files: must name rank0\.pt \.\. rank2\.pt"):
        checkpoint.index_from_dict(INDEX | {"world_size": 3})
    with pytest.raises(TfrunError, match=r"^index\.files\.rank1\.pt\.sha256: must be 64 hex digits"):
        checkpoint.index_from_dict(INDEX | {"files": INDEX["files"] | {"rank1.pt": {"bytes": 1, "sha256": "x"}}})


@settings(max_examples=300, deadline=None)
@given(mutated(INDEX) | json_values)
def test_fuzzed_indexes_raise_only_tfrun_errors(obj) -> None:
    try:
        checkpoint.index_from_dict(obj)
    except TfrunError:
        pass


def test_a_huge_world_size_is_refused_at_once() -> None:
    # found by the fuzzer above: the check built the set of 10**12 expected names (10 GB, minutes)
    with pytest.raises(TfrunError, match=r"^index\.files: must name rank0\.pt \.\. rank999999999999\.pt"):
        checkpoint.index_from_dict(INDEX | {"world_size": 10**12})


def test_checkpoint_files_get_the_mode_a_plain_open_gives(tmp_path) -> None:
    # mkstemp creates files 0600: exported weights and checkpoints were readable by their owner alone.
    umask = os.umask(0o022)
    try:
        size, digest = checkpoint._write_durable(tmp_path / "w.bin", lambda stream: stream.write(b"abc"))
    finally:
        os.umask(umask)
    assert (size, stat.S_IMODE((tmp_path / "w.bin").stat().st_mode)) == (3, 0o644)
    assert digest == hashlib.sha256(b"abc").hexdigest()
