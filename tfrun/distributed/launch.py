"""Start a job's ranks on this host through torch's own launcher (torch.distributed.run), or join an
external torchrun job; stop it gracefully on a signal; report a failed or dead rank by number.

    tfrun train --plan plan.json            # launches plan.num_ranks local processes itself
    torchrun --nnodes 2 --nproc-per-node 4 -m tfrun train --plan plan.json   # joins that job

Note [launcher signals]: torchrun runs in its own session, so a Ctrl-C in the terminal reaches only this
launcher (torchrun would otherwise forward it and kill the ranks after its shutdown timeout). The first
SIGINT or SIGTERM writes OUT/STOP: the ranks finish their step, checkpoint and exit 0 (tfrun.distributed.signals Note
[graceful stop]), and the launcher prints how to resume. A second signal kills the whole job at once. If
the launcher itself dies, torchrun gets SIGTERM (Linux: PR_SET_PDEATHSIG) and stops the ranks.

Note [dead ranks]: torchrun's monitor (every MONITOR_INTERVAL_S) sees a rank that died (SIGKILL, OOM
killer) and stops the others; they either fail at once on the broken connection or are killed after
SHUTDOWN_TIMEOUT_S. The message names the dead rank first and the last complete checkpoint.
"""

from __future__ import annotations

import os
import re
import signal
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path

from tfrun.config.train_config import TrainConfig
from tfrun.distributed.signals import LAUNCHED_ENV, STOP_FILE, resume_command
from tfrun.errors import TfrunError

MONITOR_INTERVAL_S = 0.2
"""How often torchrun checks its ranks."""
SHUTDOWN_TIMEOUT_S = 15
"""Seconds torchrun waits for the other ranks to exit after one failed, before SIGKILL (the ranks' own
graceful stop goes through OUT/STOP, not through torchrun, so this only bounds a failure's teardown)."""


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

    The worker processes get the config as OUT/run_config.json. torchrun's own log goes to
    OUT/launcher.log (it repeats worker tracebacks); we print one line per failed rank instead.

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
    cmd = [
        sys.executable, "-m", "torch.distributed.run",
        "--standalone", "--nnodes=1", f"--nproc-per-node={config.num_ranks * config.dp}",
        "--max-restarts=0", f"--monitor-interval={MONITOR_INTERVAL_S}",
        "-m", "tfrun.cli.worker", str(config_path),
    ]
    env = dict(os.environ, OMP_NUM_THREADS=str(config.threads), PYTHONUNBUFFERED="1", **{LAUNCHED_ENV: "1"})
    env.setdefault("TORCH_ELASTIC_SHUTDOWN_TIMEOUT", str(SHUTDOWN_TIMEOUT_S))
    env.pop("TORCHELASTIC_ERROR_FILE", None)
    log_path = out / "launcher.log"
    with open(log_path, "w") as log:
        proc = subprocess.Popen(cmd, env=env, stdout=None, stderr=log if quiet_launcher else None,
                                start_new_session=True, preexec_fn=_die_with_parent)
        signals = _wait(proc, out)
    if len(signals) > 1:
        raise TfrunError(f"aborted by a second {signals[1]}: the ranks were killed; "
                         f"{_last_checkpoint(out, config)}")
    if proc.returncode != 0:  # (a retime has no checkpoints to speak of)
        raise TfrunError(failure_message(out, log_path.read_text() if log_path.exists() else "")
                         + ("" if config.retime else "; " + _last_checkpoint(out, config)))
    (out / STOP_FILE).unlink(missing_ok=True)
    latest = checkpoint.read_latest(out)
    if latest is not None and latest["step"] < config.steps:
        return Stopped(step=latest["step"], resume=resume_command(str(out)))
    return None


def _die_with_parent() -> None:
    """In the torchrun child before exec: SIGTERM when the launcher dies (Linux only)."""
    if sys.platform.startswith("linux"):
        import ctypes

        pr_set_pdeathsig = 1
        ctypes.CDLL(None).prctl(pr_set_pdeathsig, signal.SIGTERM)


def _wait(proc: subprocess.Popen, out: Path) -> list[str]:
    """Wait for torchrun, handling SIGINT / SIGTERM (Note [launcher signals]); returns the signals seen."""
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
            try:
                os.killpg(proc.pid, signal.SIGKILL)
            except ProcessLookupError:
                pass

    previous = {sig: signal.signal(sig, handle) for sig in (signal.SIGINT, signal.SIGTERM)}
    try:
        proc.wait()
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


def failure_message(out: Path, log: str) -> str:
    """One line naming the failed ranks: the ones that died without a word first (the usual root cause),
    then the ones that reported an error (often just the lost connection to a dead peer)."""
    errors = {}
    for p in (out / "errors").glob("rank*.txt"):
        try:
            errors[int(p.stem[4:])] = (p.read_text().splitlines() or [""])[0]
        except (OSError, ValueError):
            continue
    died = []
    for rank, code in re.findall(r"rank\s*:\s*(\d+) \(local_rank.*?\)\s*\n\s*exitcode\s*:\s*(-?\d+)", log):
        if int(rank) not in errors and int(rank) not in (r for r, _ in died):
            how = f"was killed by signal {-int(code)}" if int(code) < 0 else f"died with exit code {code}"
            died.append((int(rank), f"rank {rank} {how}"))
    parts = [text for _, text in sorted(died)]
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
