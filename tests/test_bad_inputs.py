"""The hostile-input corpus (tests/bad_inputs/manifest.json): every malformed plan, profile, run config, data
file, checkpoint folder and argument set gives its one-line error with exit code 1 (2 for usage errors), no
traceback, and writes nothing: the output folder is never created and the inputs are left as they were.

Commands run in-process (typer's CliRunner; `python -m tfrun.cli.worker` through its main), with the launcher
replaced by a failure, so a case that wrongly passes validation fails here instead of training.
"""

from __future__ import annotations

import hashlib
import json
import re
import shutil
import sys
from pathlib import Path

import pytest

from tests.conftest import torch_or_skip

CORPUS = Path(__file__).resolve().parent / "bad_inputs"
CASES = json.loads((CORPUS / "manifest.json").read_text())["cases"]


def _snapshot(root: Path) -> dict[str, str]:
    return {str(p.relative_to(root)): hashlib.sha256(p.read_bytes()).hexdigest() if p.is_file() else "dir"
            for p in sorted(root.rglob("*"))}


def _flat(text: str) -> str:
    """Text without rich's panel borders and line wrapping (usage errors come in a box)."""
    return re.sub(r"\s+", " ", re.sub(r"[│╭╮╰╯─]", " ", text)).strip()


def _never(*args, **kwargs):
    raise AssertionError("the case passed validation and would have started training")


def test_the_corpus_is_complete():
    names = [c["case"] for c in CASES]
    assert len(names) == len(set(names)) >= 30
    kinds = {arg.split("/")[1] for c in CASES for arg in c["args"] if arg.startswith("{bad}/")}
    assert {"plans", "profiles", "configs", "data", "runs"} <= kinds, kinds
    assert any(c["tool"] == "worker" for c in CASES) and any(c["code"] == 2 for c in CASES)
    for case in CASES:
        assert set(case) <= {"case", "tool", "args", "expect", "code", "only"}, case
        assert case["code"] in (1, 2) and case["tool"] in ("tfrun", "tfplan", "worker")
        for arg in case["args"]:  # every input file named exists (or is meant to be missing)
            if arg.startswith("{bad}/") and "missing" not in arg:
                assert (CORPUS / arg.removeprefix("{bad}/")).exists(), (case["case"], arg)


@pytest.mark.parametrize("case", CASES, ids=[c["case"] for c in CASES])
def test_bad_input(case, tmp_path, monkeypatch, capsys):
    if case.get("only") == "linux" and not sys.platform.startswith("linux"):
        pytest.skip("needs Linux")
    if case["tool"] != "tfplan":
        torch_or_skip()
    from typer.testing import CliRunner

    from tfrun.cli import worker
    from tfrun.distributed import launch

    monkeypatch.setattr(launch, "launch", _never)
    monkeypatch.setattr(worker, "run_worker", _never)
    bad, out = tmp_path / "bad", tmp_path / "out"
    shutil.copytree(CORPUS, bad)
    before = _snapshot(bad)
    args = [a.replace("{bad}", str(bad)).replace("{out}", str(out)) for a in case["args"]]
    if case["tool"] == "worker":
        with pytest.raises(SystemExit) as exit_info:
            worker.main(args)
        code, captured = exit_info.value.code, capsys.readouterr()
        stdout, stderr = captured.out, captured.err
    else:
        if case["tool"] == "tfrun":
            from tfrun.cli.app import app
        else:
            from tfplan.cli.app import app
        result = CliRunner().invoke(app, args)
        assert result.exception is None or isinstance(result.exception, SystemExit), repr(result.exception)
        code, stdout, stderr = result.exit_code, result.stdout, result.stderr
    assert code == case["code"], (stdout, stderr)
    assert "Traceback" not in stdout + stderr
    assert case["expect"] in _flat(stderr), stderr
    if code == 1:
        lines = stderr.strip().splitlines()
        assert len(lines) == 1 and lines[0].startswith("error: "), stderr
    assert not out.exists(), sorted(out.rglob("*"))
    assert _snapshot(bad) == before  # nothing written, nothing half-written, nothing removed
