"""tfplan.solve.heap: when glibc's heap is trimmed (the CLI's process-wide settings are tested in
tests/tfplan/cli/test_app.py, in child processes)."""

from __future__ import annotations

import pytest

from tfplan.solve import heap


@pytest.mark.parametrize("one_arena", [False, True])
def test_solves_trim_between_them_only_where_threads_have_their_own_arenas(monkeypatch, one_arena: bool) -> None:
    # release_between_solves: with one arena for all threads the next GLOP model reuses what the last freed, so
    # no trim; after the solve (release_freed_memory) always.
    trims = []
    monkeypatch.setattr(heap, "_MALLOC_TRIM", lambda pad: trims.append(pad))
    monkeypatch.setattr(heap, "_one_arena", one_arena)
    heap.release_between_solves()
    assert trims == ([] if one_arena else [0])
    heap.release_freed_memory()
    assert trims[-1:] == [0]
