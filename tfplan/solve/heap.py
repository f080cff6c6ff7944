"""The process's memory (glibc's malloc, numpy's pages): what a million-action job changes in it, and why.

tfplan's CLI sets the process up at start (configure): large allocations stay on the heap, one heap for all
threads (keep_large_allocations), and numpy's arrays on small pages (small_pages_for_arrays). fastlp hands
freed heap memory back after its solve (release_freed_memory) and, where threads have their own arenas, after
each GLOP solve (release_between_solves). The malloc settings do nothing where the C library is not glibc.
No heavy imports at module level: the CLI imports this before anything else runs.

Note [first touches]
  On this 2-core VM (a Firecracker guest) memory the process touches for the first time is slow, and much
  slower in 2 MB pages (a 1 GiB memset on small pages took 0.65 s; numpy's huge-page arrays cost up to 7 ms
  per MB). Our reading, not verified on the host: the guest hands free 2 MB blocks back to the host (free
  page reporting), which must back each afresh when it is touched again. A million-action solve grows by
  about 1 GB (random-0 1F1B 32 x 16384: 426 -> 1389 MiB), and its steps cost what they grow (on huge pages:
  tfplan.solve.fastlp's first compression 149 MiB in 1.29 s; a tied dual that grows 143 MiB 1.61 s, one that grows
  9 MiB 0.42 s). Each setting below cuts that cost and is measured there.
"""

from __future__ import annotations

import ctypes
import os
import sys

MMAP_THRESHOLD = 1 << 30
"""Bytes from which glibc's malloc maps fresh pages for an allocation instead of reusing its heap (its default
starts at 128 KiB and rises to at most 32 MiB). Pages the process has not touched yet cost a fault each, and on
this 2-core VM first touches cost about 7 ms per MB inside a solve (a 2M-row gather: 0.15-0.46 s the first
time, 1-10 ms again); numpy's arrays of a million-action job (8-64 MB each) were all fresh mappings. Measured on
`tfplan solve` of random-0 1F1B 32 x 16384, alternating in one session: 31.9-32.1 s (median 32.0) against
32.9-37.0 s (median 36.1) with glibc's default, peak RSS 1385-1391 against 1316-1332 MiB (measured with
release_freed_memory after each GLOP solve, before ARENA_MAX). The automatic trim on free is raised to the same,
so freed memory is kept until such a trim. (Most of those 7 ms per MB, it turned out, were numpy's huge
pages: HUGE_PAGES_FOR_ARRAYS. On small pages the threshold still pays: fastlp's solve 18.2-20.3 s against
20.9-23.1 s with glibc's default threshold, alternating, 09:59-10:03 UTC.)"""

ARENA_MAX = 1
"""glibc's malloc arenas: one, shared by every thread. By default each thread that allocates gets its own (up to
8 per core), and memory freed in one is not reused by another: fastlp solves its tied primal and tied dual in
worker threads (new ones each phase) while numpy works in the main thread, so each GLOP model and each
compression faulted in fresh pages, and on this VM a solve's page faults cost seconds of system time
(tfplan.solve.fastlp's solve of random-0 1F1B 32 x 16384: 290-310k faults, 5.9-7.2 s system time). With one arena,
measured alternating in fresh processes (09:30-09:36 UTC, four each): the solve 18.7-24.1 s (median 19.9)
against 19.2-27.7 s (median 23.3), 248-257k faults and 3.6-4.7 s system time, peak RSS 1226-1248 against
1436-1462 MiB. GLOP allocates little while it iterates, so the shared arena's lock is not contended."""


def _glibc(name: str, argtypes: list, restype=ctypes.c_int):
    """A function of the C library the process already uses, typed, or None where it has none."""
    try:
        function = getattr(ctypes.CDLL(None), name, None)
    except OSError:
        return None
    if function is not None:
        function.argtypes, function.restype = argtypes, restype
    return function


_MALLOC_TRIM = _glibc("malloc_trim", [ctypes.c_size_t])
_MALLOPT = _glibc("mallopt", [ctypes.c_int, ctypes.c_int])
_M_TRIM_THRESHOLD, _M_MMAP_THRESHOLD, _M_ARENA_MAX = -1, -3, -8  # glibc's malloc.h


HUGE_PAGES_FOR_ARRAYS = False
"""Whether numpy asks the kernel for transparent huge pages for its large arrays (numpy's default on Linux: yes,
its NUMPY_MADVISE_HUGEPAGE=1). Here the kernel grants them on first touch (thp_fault_alloc in /proc/vmstat), and
each is a fresh 2 MB block for the host to back (Note [first touches]). Measured on fastlp's solve of random-0
1F1B 32 x 16384 with the heap settings above, alternating in fresh processes (09:59-10:03 UTC, three each):
18.2-20.3 s (median 18.6) on small pages against 24.0-26.0 s (median 24.4) on huge ones, 1.3-1.4 against
5.1-5.5 s of system time, the same peak RSS (1389-1401 against 1391-1410 MiB). A user's own
NUMPY_MADVISE_HUGEPAGE is left as it is."""

_one_arena = False  # keep_large_allocations has set ARENA_MAX (release_between_solves then does nothing)


def configure() -> None:
    """The CLI's process-wide memory settings (Note [first touches]): call before any thread starts."""
    keep_large_allocations()
    small_pages_for_arrays()


def small_pages_for_arrays() -> None:
    """numpy's madvise of huge pages for large arrays set to HUGE_PAGES_FOR_ARRAYS, unless the user set
    NUMPY_MADVISE_HUGEPAGE (numpy reads it once, at import: the CLI has imported numpy by now)."""
    if "NUMPY_MADVISE_HUGEPAGE" in os.environ:
        return
    os.environ["NUMPY_MADVISE_HUGEPAGE"] = str(int(HUGE_PAGES_FOR_ARRAYS))  # for numpy imported after this
    numpy = sys.modules.get("numpy")
    core = getattr(numpy, "_core", None) or getattr(numpy, "core", None)  # numpy 2, numpy 1
    multiarray = getattr(core, "multiarray", None)
    setter = getattr(multiarray, "_set_madvise_hugepage", None)
    if setter is not None:
        setter(HUGE_PAGES_FOR_ARRAYS)


def keep_large_allocations() -> None:
    """Set glibc's mmap and trim thresholds to MMAP_THRESHOLD and its arenas to ARENA_MAX (for the whole process;
    call it before any thread starts)."""
    global _one_arena
    if _MALLOPT is not None:
        _MALLOPT(_M_MMAP_THRESHOLD, MMAP_THRESHOLD)
        _MALLOPT(_M_TRIM_THRESHOLD, MMAP_THRESHOLD)
        _one_arena = _MALLOPT(_M_ARENA_MAX, ARENA_MAX) == 1


def release_freed_memory() -> None:
    """Hand the heap memory freed so far back to the OS (glibc's malloc_trim, 0.1-6 ms): after a solve, so that
    Python's own allocations (which map fresh pages) do not come on top of what the solve freed."""
    if _MALLOC_TRIM is not None:
        _MALLOC_TRIM(0)


def release_between_solves() -> None:
    """release_freed_memory after each GLOP solve, unless every thread shares one arena (keep_large_allocations).

    By default GLOP runs in several threads, each with its own malloc arena, and glibc keeps what they free for
    that thread alone. Measured on `tfplan solve` of random-0 1F1B 32 x 16384 with glibc's default arenas: the
    process held 1379 MiB when the solve returned and 767 MiB after one trim; with a trim after each GLOP solve
    and one after the solve, its peak fell from 1491 to 1272 MiB. With one arena the next model reuses what
    the last freed, and a trim only makes it fault in afresh: fastlp's solve there, alternating in fresh
    processes (09:45-09:53 UTC, three each), 17.3-20.0 s (median 17.4) without trims between solves against
    19.2-25.9 s (median 22.5) with them, 110-117k page faults against 253-261k, peak RSS 1384-1435 against
    1228-1255 MiB."""
    if not _one_arena:
        release_freed_memory()
