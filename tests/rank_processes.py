"""Start a test's rank processes by forking this one (the test process), so that they inherit its imports.

    rank_processes.start(fn, (arg, ...), nprocs)    # fn(rank, arg, ...) in each of nprocs processes, joined

A spawned rank imports torch, its pipelining package and tfrun again (4-5 s a rank, both at once on 2 cores,
measured 2026-12-07 on the 2-core AMD EPYC VM); a forked one starts in milliseconds, as tfrun's own launcher forks
its ranks (tfrun/distributed/launch.py Note [forked ranks]). Forking is safe only from a process that holds no
other Python thread, no process group and no OpenMP team; the suite runs torch on one thread (tests/conftest.py),
and where any of the three does not hold the ranks are spawned, as before.
"""

from __future__ import annotations

import gc
import logging
import sys
import threading


def preload() -> None:
    """Import what the ranks of tfrun's jobs import, once in this process, so that forked ranks inherit it."""
    import torch.distributed.pipelining  # noqa: F401  (torch._dynamo and torch.distributed.tensor with it)

    import tfplan.cli.app  # noqa: F401
    import tfrun.cli.app  # noqa: F401
    import tfrun.cli.worker  # noqa: F401
    import tfrun.distributed.launch  # noqa: F401


def _stop_tqdm_monitors() -> None:
    """tqdm's monitor threads (started by the progress bars of transformers' and huggingface_hub's loaders in other
    tests, one per tqdm class) sleep between checks of open bars; tqdm starts a new one with its next bar."""
    monitor = getattr(sys.modules.get("tqdm._monitor"), "TMonitor", None)
    for thread in threading.enumerate():
        if monitor is not None and isinstance(thread, monitor):
            thread.exit()


def fork_is_safe() -> bool:
    """Whether a forked child of this process starts in a consistent state: no other Python thread (whose locks
    the child would inherit held), no process group (the child makes its own) and torch on one thread (an OpenMP
    team does not survive a fork)."""
    import torch
    import torch.distributed as dist

    return threading.active_count() == 1 and not dist.is_initialized() and torch.get_num_threads() == 1


def start(fn, args: tuple, nprocs: int) -> None:
    """fn(rank, *args) in `nprocs` processes, forked when that is safe (else spawned); returns once all have
    exited, raising as torch.multiprocessing.spawn does when one of them failed."""
    import torch.multiprocessing as mp

    preload()
    _stop_tqdm_monitors()
    method = "fork" if fork_is_safe() else "spawn"
    mp.start_processes(_rank, args=(fn, *args), nprocs=nprocs, join=True, start_method=method)


def _rank(rank: int, fn, *args) -> None:
    """A rank as a process of its own starts: its sys.stdout and sys.stderr write to file descriptors 1 and 2 (a
    forked one inherits pytest's capturing objects, which would swallow what the job prints), the root logger has
    no handler of pytest's, and what it inherited (the test session's objects) is out of the collector's sight,
    as tfrun's forked ranks do (Note [forked ranks]), so that its collections walk only its own objects; then fn."""
    sys.stdout = open(1, "w", buffering=1, closefd=False)  # noqa: SIM115  (descriptors the process keeps)
    sys.stderr = open(2, "w", buffering=1, errors="backslashreplace", closefd=False)  # noqa: SIM115
    logging.root.handlers.clear()
    logging.root.setLevel(logging.WARNING)
    gc.freeze()
    fn(rank, *args)
