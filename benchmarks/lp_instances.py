"""The instances of the LP benchmarks (benchmarks/solver_scale.py): random heterogeneous profiles (the tests'
stage costs, and the hard set of issue 48 over spreads and p2p lags), and the whole `tfplan solve` command run on
one in a fresh process, as a user runs it.
"""

from __future__ import annotations

import json
import os
import random
import subprocess
import sys
import time
from pathlib import Path

try:
    import tfplan  # noqa: F401
except ImportError:  # running from a checkout without installing
    sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from tfplan.cost.profile import Profile, StageCost
from tfplan.fileio import write_json_atomic

CAP = 0.9


def _stage(rng: random.Random, spread: float = 1.0) -> StageCost:
    """One stage as tests/tfplan/solve/fastlp/instances.py's _random_profile draws it (B 1-4 ms, I 30-70% of B, frozen
    B 30-90%, frozen W 0-30%, F 0.5-2 ms; 15% unfreezable), B and F 1 + 3 spread and 0.5 + 1.5 spread ms at most."""
    b = rng.uniform(1.0, 1.0 + 3.0 * spread)
    i = rng.uniform(0.3, 0.7) * b
    stiff = rng.random() < 0.15
    b_frozen = b if stiff else rng.uniform(0.3, 0.9) * b
    w_frozen = b - i if stiff else rng.uniform(0.0, 0.3) * (b - i)
    return StageCost(forward_ms=rng.uniform(0.5, 0.5 + 1.5 * spread), backward_ms=b, backward_frozen_ms=b_frozen,
                     backward_input_ms=i, backward_weight_ms=b - i, backward_weight_frozen_ms=w_frozen)


def random_profile(num_stages: int, seed: int = 0) -> Profile:
    """The tests' per-stage costs (_stage, drawn in their order, so that a seed gives the tests' profile), with rank
    tails of 0 or up to 8 ms and a dispatch cost of 0 or 0.05 ms from a second generator."""
    rng = random.Random(seed)
    stages = [_stage(rng) for _ in range(num_stages)]
    extra = random.Random(seed + 1_000_003)
    stages = [StageCost(**{**c.to_dict(), "tail_ms": extra.choice([0.0, extra.uniform(0.0, 8.0)])}) for c in stages]
    return Profile(name=f"random-{seed}", p2p_ms=0.0, dispatch_ms=extra.choice([0.0, 0.05]), stages=tuple(stages))


def whole_command(prof: Profile, p: int, m: int, folder: Path) -> dict:
    """`tfplan solve -p PROFILE -s 1f1b -m M -c 0.9 -o plan.json` in a fresh process (its terminal view to
    /dev/null): wall seconds, peak RSS (MiB, from wait4), the plan's size and the solver's record."""
    path = folder / f"{prof.name}-{p}.json"
    write_json_atomic(path, prof.to_dict())
    plan = folder / f"plan-{p}-{m}.json"
    cmd = [sys.executable, "-m", "tfplan", "solve", "-p", str(path), "-s", "1f1b", "-m", str(m), "-c", str(CAP),
           "-o", str(plan)]
    start = time.perf_counter()
    proc = subprocess.Popen(cmd, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, env=dict(os.environ, COLUMNS="120"))
    _, status, usage = os.wait4(proc.pid, 0)
    wall = time.perf_counter() - start
    err = proc.stderr.read().decode()
    proc.stderr.close()
    if status != 0:
        raise RuntimeError(f"{' '.join(cmd)} failed: {err}")
    solver_rec = json.loads(plan.read_text())["solver"]
    return {"wall_s": wall, "peak_mib": usage.ru_maxrss / 1024, "plan_mb": plan.stat().st_size / 1e6,
            "csv_mb": plan.with_suffix(".csv").stat().st_size / 1e6, "solver_s": solver_rec["wall_s"],
            "status": solver_rec["status"], "warnings": err.strip(), "cpu_s": usage.ru_utime + usage.ru_stime,
            "phases": solver_rec["phases"]}


# (seed, spread, p2p ms), fixed before any tuning: 13 and 15, found hard before, and eight over spreads and lags.
HARD = [(13, 0.3, 0.0), (15, 1.0, 1.0), (21, 0.1, 0.0), (22, 0.3, 0.1), (23, 1.0, 0.0), (24, 1.0, 0.1),
        (25, 3.0, 0.0), (26, 3.0, 1.0), (27, 0.1, 1.0), (28, 0.3, 1.0)]


def spread_profile(num_stages: int, seed: int, spread: float, p2p_ms: float) -> Profile:
    """Stages drawn by _stage at `spread`, each with a rank tail of 0 or up to 8 spread ms from the same generator,
    and a p2p lag: spread 1 has random_profile's ranges, a small spread nearly equal stages."""
    rng, stages = random.Random(seed), []
    for _ in range(num_stages):
        c = _stage(rng, spread)
        stages.append(StageCost(**{**c.to_dict(), "tail_ms": rng.choice([0.0, rng.uniform(0.0, 8.0 * spread)])}))
    return Profile(name=f"spread-{seed}", p2p_ms=p2p_ms, dispatch_ms=rng.choice([0.0, 0.05]), stages=tuple(stages))
