"""Start a test's rank processes by forking this one (the test process), so that they inherit its imports.

    rank_processes.start(fn, (arg, ...), nprocs)    # fn(rank, arg, ...) in each of nprocs processes, joined

A spawned rank imports torch, its pipelining package and tfrun again (4-5 s a rank, both at once on 2 cores,
measured 2026-12-07 on the 2-core AMD EPYC VM); a forked one starts in milliseconds, as tfrun's own launcher forks
its ranks (tfrun/distributed/launch.py Note [forked ranks]). Forking is safe only from a process that holds no
other Python thread, no process group, no OpenMP team and no CUDA context; the suite runs torch on one thread
(tests/conftest.py), and where any of these does not hold the ranks are spawned, as before.
"""

from __future__ import annotations

import gc
import importlib
import logging
import sys
import threading
import warnings


def preload() -> None:
    """Import what the ranks of tfrun's jobs import, once in this process, so that forked ranks inherit it."""
    import tfplan.cli.app  # noqa: F401
    import tfrun.cli.app  # noqa: F401
    from tfrun.distributed import launch, runtime

    runtime.check_torch()  # imports torch.distributed.pipelining (torch._dynamo with it), as tfrun's set-up does
    for name in launch.WARM_MODULES:
        importlib.import_module(name)


def _stop_tqdm_monitors() -> None:
    """tqdm's monitor threads (started by the progress bars of transformers' and huggingface_hub's loaders in other
    tests, one per tqdm class) sleep between checks of open bars; tqdm starts a new one with its next bar."""
    monitor = getattr(sys.modules.get("tqdm._monitor"), "TMonitor", None)
    for thread in threading.enumerate():
        if monitor is not None and isinstance(thread, monitor):
            thread.exit()


def fork_blockers() -> list[str]:
    """What keeps a forked child of this process from starting in a consistent state (empty: forking is safe):
    another Python thread (whose locks the child would inherit held), a process group (the child makes its own),
    torch on more than one thread (an OpenMP team does not survive a fork), CUDA initialised (nor does it)."""
    import torch
    import torch.distributed as dist

    blockers = [f"thread {t.name!r}" for t in threading.enumerate() if t is not threading.main_thread()]
    if dist.is_initialized():
        blockers.append("a process group")
    if torch.get_num_threads() != 1:
        blockers.append(f"torch on {torch.get_num_threads()} threads")
    if torch.cuda.is_initialized():
        blockers.append("CUDA initialised")
    return blockers


def start(fn, args: tuple, nprocs: int) -> None:
    """fn(rank, *args) in `nprocs` processes, forked when that is safe (else spawned, with a warning in pytest's
    summary: the suite then pays the ranks' imports again); returns once all have exited, raising as
    torch.multiprocessing.spawn does when one of them failed."""
    import torch.multiprocessing as mp

    preload()
    _stop_tqdm_monitors()
    blockers = fork_blockers()
    if blockers:
        warnings.warn(f"rank processes spawned, not forked: {', '.join(blockers)}", stacklevel=2)
    mp.start_processes(_rank, args=(fn, *args), nprocs=nprocs, join=True, start_method="spawn" if blockers else "fork")


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
