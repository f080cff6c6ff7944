"""Shared test helpers. Tests that need torch use `torch_or_skip()` so the suite runs without it."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
PROFILES = ROOT / "profiles"
GOLDEN = Path(__file__).resolve().parent / "golden"

# Rich draws for the width it detects; fix it so CLI output is the same everywhere.
os.environ.setdefault("COLUMNS", "120")


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
