"""Start a job's ranks on this host, forked from the launcher with its imports done, or join an external torchrun
job; stop it gracefully on a signal; report a failed or dead rank by number.

    tfrun train --plan plan.json            # starts plan.num_ranks x dp local processes itself
    torchrun --nnodes 2 --nproc-per-node 4 -m tfrun train --plan plan.json   # joins that job

Note [forked ranks]: a rank's process is forked from the launcher once the launcher has imported torch, its
pipelining package (which imports torch._dynamo) and tfrun's training loop, so no rank pays those imports again
(about 4 s each on 2 cores) and no agent process sits between them (torch.distributed.run costs its own torch
import, 2-3 s, and a rendezvous). The ranks meet through a file store in a fresh temporary folder (no TCP port
chosen in advance that another process could take). The launcher does no tensor work, so no OpenMP pool is
inherited; each rank sets its own thread count (--threads). CUDA does not survive a fork (a process that asked
for a device count may not use CUDA in a forked child), so on a host with a CUDA device each forked rank execs a
fresh `python -m tfrun.cli.worker` at once and pays its own imports, as under torchrun (TFRUN_FRESH_RANKS=1 does
the same anywhere). A rank runs tfrun.cli.worker as a process of `python -m tfrun.cli.worker` would, with the
variables torchrun gives its workers (RANK, LOCAL_RANK, WORLD_SIZE, LOCAL_WORLD_SIZE), and leaves with os._exit:
the launcher's exit handlers are not the rank's. A forked rank first moves every object it inherited into the
collector's permanent generation (gc.freeze): torch's imports leave about 290,000 objects that no rank frees,
and the rank's collections need not walk them (its last one, tfrun.cli.worker: 0.17 s on 2 cores, 1-3 ms
frozen). The launcher does not freeze before forking: it may be a longer-lived process (a test session, a user's
script calling launch) whose own garbage must stay collectable; the CLI's process freezes only on its way out
(tfrun.cli.app.main).

Note [launcher signals]: the ranks run in a process group of their own, so a Ctrl-C in the terminal reaches only
this launcher. The first SIGINT or SIGTERM writes OUT/STOP: the ranks finish their step, checkpoint and exit 0
(tfrun.distributed.signals Note [graceful stop]), and the launcher prints how to resume. A second signal kills
the whole job at once. If the launcher itself dies, each rank gets SIGTERM (Linux: PR_SET_PDEATHSIG) and stops
after its step.

Note [dead ranks]: the launcher checks its ranks every MONITOR_INTERVAL_S. When one exits with an error or is
killed (SIGKILL, the OOM killer), the others get SIGTERM; they either fail at once on the broken connection or
are killed after SHUTDOWN_TIMEOUT_S. The message names the dead rank first and the last complete checkpoint.
"""

from __future__ import annotations

import gc
import importlib
import os
import shutil
import signal
import sys
import tempfile
import time
import traceback
from collections.abc import Collection
from dataclasses import dataclass, field
from pathlib import Path
from typing import IO

from tfrun.config.train_config import TrainConfig
from tfrun.distributed.signals import LAUNCHED_ENV, STOP_FILE, resume_command
from tfrun.errors import TfrunError

MONITOR_INTERVAL_S = 0.05
"""How often the launcher checks its ranks (Note [dead ranks])."""
SHUTDOWN_TIMEOUT_S = 15
"""Seconds the launcher waits for the other ranks to exit after one failed, before SIGKILL (the ranks' own
graceful stop goes through OUT/STOP, not through the launcher's signals, so this only bounds a failure's
teardown)."""
FRESH_ENV = "TFRUN_FRESH_RANKS"
"""Set to 1, every rank execs a fresh interpreter as on a CUDA host (Note [forked ranks])."""
STORE_ENV = "TFRUN_STORE"
"""The file store a forked job's ranks meet at (tfrun.cli.worker.init_process_group)."""


def under_torchrun() -> bool:
    """True inside a process started by torchrun (it sets these for every worker)."""
    return all(k in os.environ for k in ("RANK", "WORLD_SIZE", "LOCAL_RANK", "MASTER_ADDR"))


@dataclass(frozen=True, kw_only=True, slots=True)
class Stopped:
    """A run that stopped early on request and can be resumed."""

    step: int
    """Steps completed (the checkpoint's step)."""
    resume: str
    """The command that continues it."""


def launch(config: TrainConfig, *, quiet_launcher: bool = True) -> Stopped | None:
    """Run `config` on config.num_ranks x config.dp local processes; returns Stopped if a signal stopped it early.

    The ranks get the config as OUT/run_config.json; their stderr goes to OUT/launcher.log (unless
    `quiet_launcher` is False), and we print one line per failed rank instead.

    Raises:
        TfrunError: naming the failed rank and the last complete checkpoint, or an abort by a second signal.
    """
    from tfrun.records import checkpoint

    out = Path(config.out_dir)
    (out / "errors").mkdir(parents=True, exist_ok=True)
    for stale in [*(out / "errors").glob("rank*.txt"), out / STOP_FILE]:
        stale.unlink(missing_ok=True)
    config_path = out / "run_config.json"
    config.save(config_path)
    env = {"OMP_NUM_THREADS": str(config.threads), LAUNCHED_ENV: "1"}
    with open(out / "launcher.log", "w") as log:
        job = start_ranks(config_path, config.num_ranks * config.dp, env, log if quiet_launcher else None,
                          config.threads)
        signals = _wait(job, out)
    if len(signals) > 1:
        raise TfrunError(f"aborted by a second {signals[1]}: the ranks were killed; "
                         f"{_last_checkpoint(out, config)}")
    if any(job.exit_codes.values()):  # (a retime has no checkpoints to speak of)
        raise TfrunError(failure_message(out, job.exit_codes, job.stopped)
                         + ("" if config.retime else "; " + _last_checkpoint(out, config)))
    (out / STOP_FILE).unlink(missing_ok=True)
    latest = checkpoint.read_latest(out)
    if latest is not None and latest["step"] < config.steps:
        return Stopped(step=latest["step"], resume=resume_command(str(out)))
    return None


@dataclass(kw_only=True)
class LocalJob:
    """The ranks of one job, forked by start_ranks (Note [forked ranks])."""

    pids: list[int]
    """Process id of each rank, by rank."""
    store_dir: str
    """The temporary folder of the ranks' file store, removed when they are gone."""
    exit_codes: dict[int, int] = field(default_factory=dict)
    """rank -> exit code of the ranks that have exited (negative: killed by that signal), in the order seen."""
    stopped: set[int] = field(default_factory=set)
    """The ranks the launcher stopped because another had failed (not a cause of the failure)."""

    def poll(self) -> None:
        """Collect the ranks that have exited since the last call."""
        for rank, pid in enumerate(self.pids):
            if rank in self.exit_codes:
                continue
            try:
                done, status = os.waitpid(pid, os.WNOHANG)
            except ChildProcessError:  # (reaped elsewhere: nothing is known of how it ended)
                done, status = pid, 1 << 8
            if done:
                self.exit_codes[rank] = os.waitstatus_to_exitcode(status)

    def alive(self) -> list[int]:
        return [pid for rank, pid in enumerate(self.pids) if rank not in self.exit_codes]

    def signal(self, signum: int) -> None:
        """Send `signum` to every rank still running."""
        for pid in self.alive():
            try:
                os.kill(pid, signum)
            except ProcessLookupError:
                pass

    def wait(self) -> None:
        """Until every rank has exited; once one fails, stop the others (Note [dead ranks])."""
        failed_at = None
        while self.alive():
            self.poll()
            if failed_at is None and any(self.exit_codes.values()):
                failed_at = time.monotonic()
                self.stopped = {rank for rank in range(len(self.pids)) if rank not in self.exit_codes}
                self.signal(signal.SIGTERM)
            elif failed_at is not None and time.monotonic() - failed_at > SHUTDOWN_TIMEOUT_S:
                self.signal(signal.SIGKILL)
            if self.alive():
                time.sleep(MONITOR_INTERVAL_S)
        shutil.rmtree(self.store_dir, ignore_errors=True)

    def kill(self) -> None:
        self.signal(signal.SIGKILL)


RANK_MODULE = "tfrun.cli.worker"
"""The module each rank runs (its main([CONFIG])), named as `python -m` names it: it sits above this layer."""
WARM_MODULES = (RANK_MODULE, "tfrun.train", "tfrun.retime")
"""What every rank imports, imported once in the launcher before the fork (Note [forked ranks]); tfrun.train brings
torch, and the set-up's tfrun.distributed.runtime.check_torch has imported torch.distributed.pipelining."""


def start_ranks(config_path: Path, world: int, env: dict[str, str], stderr: IO | None, threads: int) -> LocalJob:
    """Fork `world` ranks that run tfrun.cli.worker on `config_path` with `env` added (Note [forked ranks]);
    their stderr to `stderr` (None: the launcher's)."""
    import torch

    fresh = torch.cuda.is_available() or os.environ.get(FRESH_ENV) == "1"  # (Note [forked ranks])
    if not fresh:
        for name in WARM_MODULES:
            importlib.import_module(name)
    store_dir = tempfile.mkdtemp(prefix="tfrun-store-")
    env = env | {STORE_ENV: os.path.join(store_dir, "store"), "WORLD_SIZE": str(world),
                 "LOCAL_WORLD_SIZE": str(world)}
    sys.stdout.flush()  # (what the launcher buffered would be written again by every rank)
    sys.stderr.flush()
    launcher, pids = os.getpid(), []
    for rank in range(world):
        pid = os.fork()
        if pid == 0:
            _rank_main(rank, str(config_path), env, stderr.fileno() if stderr is not None else None, threads,
                       pids[0] if pids else 0, launcher, fresh)
        pids.append(pid)
        try:  # (also in the child: whichever runs first puts it in the job's group)
            os.setpgid(pid, pids[0])
        except (PermissionError, ProcessLookupError):
            pass
    return LocalJob(pids=pids, store_dir=store_dir)


def _rank_main(rank: int, config_path: str, env: dict[str, str], stderr_fd: int | None, threads: int, group: int,
               launcher: int, fresh: bool) -> None:
    """A forked rank: never returns (Note [forked ranks]); `fresh`: exec a new interpreter for it."""
    code = 1
    try:
        os.setpgid(0, group)  # (group 0: this rank starts the job's group)
        _die_with_parent()
        if os.getppid() != launcher:  # the launcher died before the line above took effect
            os._exit(1)
        for sig in (signal.SIGINT, signal.SIGTERM):
            signal.signal(sig, signal.SIG_DFL)  # (tfrun.cli.worker installs its own)
        os.environ.update(env | {"RANK": str(rank), "LOCAL_RANK": str(rank)})
        if stderr_fd is not None:
            os.dup2(stderr_fd, 2)
        if fresh:
            os.environ["PYTHONUNBUFFERED"] = "1"
            os.execv(sys.executable, [sys.executable, "-m", RANK_MODULE, config_path])
        import torch

        gc.freeze()  # (Note [forked ranks]: the launcher's objects are not this rank's garbage)
        torch.set_num_threads(threads)
        code = exit_code_of(importlib.import_module(RANK_MODULE).main, [config_path])
    finally:
        try:
            sys.stdout.flush()
            sys.stderr.flush()
        finally:
            os._exit(code)


def exit_code_of(main, argv: list[str]) -> int:
    """`main(argv)` (a rank's main, which ends in sys.exit) run in this process: its exit code, 1 for a crash
    (its traceback on stderr)."""
    try:
        main(argv)
        return 0
    except SystemExit as exc:
        return exc.code if isinstance(exc.code, int) else (0 if exc.code is None else 1)
    except BaseException:  # noqa: BLE001 - reported like a crashed rank
        traceback.print_exc()
        return 1


def _die_with_parent() -> None:
    """In a rank: SIGTERM when the launcher dies (Linux only)."""
    if sys.platform.startswith("linux"):
        import ctypes

        pr_set_pdeathsig = 1
        ctypes.CDLL(None).prctl(pr_set_pdeathsig, signal.SIGTERM)


def _wait(job: LocalJob, out: Path) -> list[str]:
    """Wait for the job, handling SIGINT / SIGTERM (Note [launcher signals]); returns the signals seen."""
    seen: list[str] = []

    def handle(signum: int, frame) -> None:
        seen.append(signal.Signals(signum).name)
        if len(seen) == 1:
            try:
                (out / STOP_FILE).touch()
            except OSError:
                pass
            print(f"{seen[0]}: stopping after the current step and a checkpoint (signal again to abort)",
                  file=sys.stderr, flush=True)
        else:
            job.kill()

    previous = {sig: signal.signal(sig, handle) for sig in (signal.SIGINT, signal.SIGTERM)}
    try:
        job.wait()
    finally:
        for sig, handler in previous.items():
            signal.signal(sig, handler)
    return seen


def _last_checkpoint(out: Path, config: TrainConfig) -> str:
    from tfrun.records import checkpoint

    step = checkpoint.newest_complete(out)
    if step is None:
        return "no complete checkpoint to resume from"
    return (f"last complete checkpoint: step {step} of {config.steps} ({checkpoint.folder(out, step)}); resume "
            f"with: {resume_command(str(out))}")


def failure_message(out: Path, exit_codes: dict[int, int], stopped: Collection[int] = ()) -> str:
    """One line naming the failed ranks: the ones that died without a word first, in the order they were seen to
    exit (the first is the usual root cause), then the ones that reported an error (often just the lost
    connection to a dead peer). `stopped`: ranks the launcher stopped after a failure, named only where no other
    rank explains it.

    >>> failure_message(Path("/nonexistent"), {2: 3, 0: -9, 1: -9}, stopped={0})
    'rank 2 died with exit code 3; rank 1 was killed by signal 9 (log: /nonexistent/launcher.log)'
    """
    errors = {}
    for p in (out / "errors").glob("rank*.txt"):
        try:
            errors[int(p.stem[4:])] = (p.read_text().splitlines() or [""])[0]
        except (OSError, ValueError):
            continue
    silent = [(rank, code) for rank, code in exit_codes.items() if code and rank not in errors]
    causes = [(rank, code) for rank, code in silent if rank not in stopped] or silent
    parts = [f"rank {rank} was killed by signal {-code}" if code < 0 else f"rank {rank} died with exit code {code}"
             for rank, code in causes]
    died = bool(parts)
    by_error: dict[str, list[int]] = {}  # ranks that failed alike (a step every rank refused) are named once
    for rank, error in sorted(errors.items()):
        by_error.setdefault(error, []).append(rank)
    for error, ranks in by_error.items():
        short = error if len(error) <= 200 else error[:197] + "..."
        who = f"rank {ranks[0]}" if len(ranks) == 1 else f"ranks {', '.join(map(str, ranks))}"
        parts.append(f"{who} {'then ' if died else ''}failed: {short}")
    if not parts:
        parts.append("the job failed")
    return "; ".join(parts) + f" (log: {out / 'launcher.log'})"
