"""The `tfplan` app (tfplan.cli.app): usage errors (exit 2), --help and `python -m tfplan`, and the process's
memory settings (tfplan.solve.heap), in child processes."""

from __future__ import annotations

import os
import subprocess
import sys

import pytest
from typer.testing import CliRunner

from tests.conftest import ROOT
from tests.tfplan.cli.runner import TOY, ok
from tfplan.cli.app import app


@pytest.mark.parametrize(
    "args",
    [
        ["simulate", "-s", "1f1b", "-m", "8"],  # --profile missing
        ["simulate", *TOY[:4], "--microbatches", "0"],
        ["simulate", *TOY, "--no-such-option"],
        ["simulate", *TOY[:4], "--microbatches", "eight"],
        ["show"],
        ["no-such-command"],
        ["show-schedule", "-s", "1f1b", "-m", "4"],  # --ranks missing
        ["solve", *TOY, "--learning-model", "sgd"],  # checked with or without a noise section to read
    ],
)
def test_usage_errors_exit_2(args) -> None:
    result = CliRunner().invoke(app, args)
    assert result.exit_code == 2
    assert "Traceback" not in result.stdout + result.stderr


def test_help_texts() -> None:
    out = ok("--help").stdout
    for command in ("simulate", "schedules", "show-schedule", "solve", "show", "whatif"):
        assert command in out
    assert "Example: tfplan simulate" in ok("simulate", "--help").stdout.replace("\n", " ")


def test_python_m_tfplan_help() -> None:
    proc = subprocess.run(
        [sys.executable, "-m", "tfplan", "--help"], capture_output=True, text=True, timeout=60, cwd=ROOT
    )
    assert proc.returncode == 0, proc.stderr
    assert "simulate" in proc.stdout and "solve" in proc.stdout


def test_the_cli_keeps_large_allocations_on_the_heap() -> None:
    # tfplan.solve.heap: after keep_large_allocations, a 64 MB numpy array comes from glibc's heap, not from a fresh
    # mapping (glibc's mallinfo2 counts mapped blocks in hblks). In a child process: the setting is per process.
    code = """
import ctypes, sys
import numpy as np
from tfplan.solve import heap
libc = ctypes.CDLL(None)
if not hasattr(libc, "mallinfo2"):
    print("skip"); sys.exit(0)
class Info(ctypes.Structure):
    _fields_ = [(name, ctypes.c_size_t) for name in ("arena", "ordblks", "smblks", "hblks", "hblkhd", "usmblks",
                                                    "fsmblks", "uordblks", "fordblks", "keepcost")]
libc.mallinfo2.restype = Info
def mapped_with(array_bytes):
    before = libc.mallinfo2().hblks
    a = np.ones(array_bytes // 8)
    return libc.mallinfo2().hblks - before
print(mapped_with(64 << 20), end=" ")
heap.keep_large_allocations()
print(mapped_with(64 << 20))
"""
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True, cwd=ROOT).stdout
    if out.strip() == "skip":
        pytest.skip("not glibc >= 2.33 (no mallinfo2)")
    assert out.split() == ["1", "0"]  # mapped by default, from the heap once the threshold is raised


@pytest.mark.parametrize("user", [None, "1"])
def test_the_cli_keeps_numpys_arrays_on_small_pages_unless_the_user_says(user: str | None) -> None:
    # tfplan.solve.heap.HUGE_PAGES_FOR_ARRAYS: after configure, numpy no longer asks for huge pages (its setter returns
    # the setting it replaces); a NUMPY_MADVISE_HUGEPAGE the user set is kept. In a child process.
    code = """
import numpy as np
from tfplan.solve import heap
heap.configure()
core = getattr(np, "_core", None) or np.core  # numpy 2, numpy 1
print(core.multiarray._set_madvise_hugepage(True))
"""
    env = {k: v for k, v in os.environ.items() if k != "NUMPY_MADVISE_HUGEPAGE"}
    if user is not None:
        env["NUMPY_MADVISE_HUGEPAGE"] = user
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True, cwd=ROOT, env=env)
    assert out.stdout.split() == (["False"] if user is None else ["True"])


def test_the_cli_keeps_one_malloc_arena_for_all_threads() -> None:
    # tfplan.solve.heap.ARENA_MAX: after keep_large_allocations, memory a worker thread allocates comes from the one
    # arena the main thread uses (glibc's malloc_stats lists each arena as "Arena N:" on stderr). In a child
    # process: the setting is per process.
    code = """
import ctypes, sys, threading
import numpy as np
from tfplan.solve import heap
libc = ctypes.CDLL(None)
if not hasattr(libc, "malloc_stats"):
    print("skip"); sys.exit(0)
if sys.argv[1] == "cli":
    heap.keep_large_allocations()
kept = []
worker = threading.Thread(target=lambda: kept.append(np.ones(1 << 17)))  # 1 MB
worker.start()
worker.join()
libc.malloc_stats()
"""
    arenas = []
    for mode in ("default", "cli"):
        run = subprocess.run([sys.executable, "-c", code, mode], capture_output=True, text=True, check=True, cwd=ROOT)
        if run.stdout.strip() == "skip":
            pytest.skip("not glibc (no malloc_stats)")
        arenas.append(sum(line.startswith("Arena ") for line in run.stderr.splitlines()))
    assert arenas == [2, 1]  # the worker's own arena by default, the main one with the CLI's setting


def test_help_keeps_the_notes_it_names() -> None:
    # Rich reads "[stage-0 anchor]" as a style tag and drops it unless escaped ("Note )." was printed).
    for args, note in ((["solve", "--help"], "Note [stage-0 anchor]"), (["whatif", "--help"], "Note [learning")):
        result = CliRunner().invoke(app, args, env={"COLUMNS": "200"})
        assert result.exit_code == 0 and note in result.output, result.output
