"""Shared test helpers. Tests that need torch use `torch_or_skip()` so the suite runs without it."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
PROFILES = ROOT / "profiles"
TESTS = Path(__file__).resolve().parent
GOLDEN = TESTS / "golden"
BAD_INPUTS = TESTS / "bad_inputs"

# Rich draws for the width it detects; fix it so CLI output is the same everywhere.
os.environ.setdefault("COLUMNS", "120")
# One compute thread for torch in the test process (and the processes it starts, unless they set their own,
# as tfrun's launcher does per rank): on 2 cores with multi-process tests or anything else running, torch's
# default of one thread per core spends its time contending (measured: a 4-micro-batch reference gradient 3.0 s
# with 2 threads against 1.0 s with 1, under load), and the suite's sizes gain nothing from a second thread.
os.environ.setdefault("OMP_NUM_THREADS", "1")


def torch_or_skip():
    """Import torch or skip the calling test cleanly."""
    return pytest.importorskip("torch", reason="torch not installed (install the 'run' extra)")


@pytest.fixture
def toy_profile_path() -> str:
    return str(PROFILES / "toy-uniform-4.json")


@pytest.fixture(scope="module")
def single_rank_group(tmp_path_factory):
    """A one-rank gloo process group in this process (collective code without torchrun)."""
    dist = torch_or_skip().distributed
    store = tmp_path_factory.mktemp("store") / "store"
    dist.init_process_group("gloo", init_method=f"file://{store}", rank=0, world_size=1)
    yield
    dist.destroy_process_group()
