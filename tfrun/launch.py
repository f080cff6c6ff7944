"""Start a job's ranks on this host through torch's own launcher (torch.distributed.run), or join an
external torchrun job; report a failed or dead rank by number.

    tfrun train --plan plan.json            # launches plan.num_ranks local processes itself
    torchrun --nnodes 2 --nproc-per-node 4 -m tfrun train --plan plan.json   # joins that job
"""

from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path

from tfrun.config import TrainConfig
from tfrun.errors import TfrunError


def under_torchrun() -> bool:
    """True inside a process started by torchrun (it sets these for every worker)."""
    return all(k in os.environ for k in ("RANK", "WORLD_SIZE", "LOCAL_RANK", "MASTER_ADDR"))


def launch(config: TrainConfig, *, quiet_launcher: bool = True) -> None:
    """Run `config` on config.num_ranks x config.dp local processes; raises TfrunError naming the failed rank.

    The worker processes get the config as OUT/run_config.json. torchrun's own log goes to
    OUT/launcher.log (it repeats worker tracebacks); we print one line per failed rank instead.
    """
    out = Path(config.out_dir)
    (out / "errors").mkdir(parents=True, exist_ok=True)
    for stale in (out / "errors").glob("rank*.txt"):
        stale.unlink()
    config_path = out / "run_config.json"
    config.save(config_path)
    cmd = [
        sys.executable, "-m", "torch.distributed.run",
        "--standalone", "--nnodes=1", f"--nproc-per-node={config.num_ranks * config.dp}",
        "--max-restarts=0", "--monitor-interval=0.2",
        "-m", "tfrun.worker", str(config_path),
    ]
    env = dict(os.environ, OMP_NUM_THREADS=str(config.threads), PYTHONUNBUFFERED="1")
    env.pop("TORCHELASTIC_ERROR_FILE", None)
    log_path = out / "launcher.log"
    with open(log_path, "w") as log:
        proc = subprocess.run(cmd, env=env, stdout=None, stderr=log if quiet_launcher else None)
    if proc.returncode != 0:
        raise TfrunError(failure_message(out, log_path.read_text() if log_path.exists() else ""))


def failure_message(out: Path, log: str) -> str:
    """One line naming the failed ranks: the ones that died without a word first (the usual root cause),
    then the ones that reported an error (often just the lost connection to a dead peer)."""
    errors = {int(p.stem[4:]): p.read_text().splitlines()[0] for p in (out / "errors").glob("rank*.txt")}
    died = []
    for rank, code in re.findall(r"rank\s*:\s*(\d+) \(local_rank.*?\)\s*\n\s*exitcode\s*:\s*(-?\d+)", log):
        if int(rank) not in errors and int(rank) not in (r for r, _ in died):
            how = f"was killed by signal {-int(code)}" if int(code) < 0 else f"died with exit code {code}"
            died.append((int(rank), f"rank {rank} {how}"))
    parts = [text for _, text in sorted(died)]
    for rank, error in sorted(errors.items()):
        short = error if len(error) <= 200 else error[:197] + "..."
        parts.append(f"rank {rank} {'then ' if died else ''}failed: {short}")
    if not parts:
        parts.append("the job failed")
    return "; ".join(parts) + f" (log: {out / 'launcher.log'})"
