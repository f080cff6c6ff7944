"""Measured profiles come from tfrun's executor, run as a subprocess: tfplan itself never imports torch."""

from __future__ import annotations

import sys

from tfplan.errors import TfplanError


def measure_profile(output, model, stages, stages_per_rank, microbatches, schedule, steps, microbatch_size, seq_len,
                    repeat=1, dp=1, init_from=None, data=None, work_dir=None):
    """Run tfrun's measuring job in a subprocess (tfplan itself never imports torch); stages_per_rank None
    takes the schedule's default."""
    import importlib.util
    import subprocess

    from tfplan.cost import profile as profile_mod

    if importlib.util.find_spec("torch") is None or importlib.util.find_spec("tfrun") is None:
        raise TfplanError(
            "measuring a profile runs the tfrun executor, which needs torch: "
            "pip install 'timelyfreeze[run]' (or use --analytic for a cost-model profile)"
        )
    cmd = [sys.executable, "-m", "tfrun", "profile", "--model", model, "--stages", str(stages),
           "--microbatches", str(microbatches), "--schedule", schedule, "--steps", str(steps),
           "--microbatch-size", str(microbatch_size), "--seq-len", str(seq_len), "--repeat", str(repeat),
           "--dp", str(dp), "--output", output]
    if stages_per_rank is not None:
        cmd += ["--stages-per-rank", str(stages_per_rank)]
    for flag, value in (("--init-from", init_from), ("--data", data), ("--work-dir", work_dir)):
        if value is not None:
            cmd += [flag, value]
    proc = subprocess.run(cmd, capture_output=True, text=True)
    if proc.returncode != 0:
        lines = [ln for ln in proc.stderr.splitlines() if ln.strip()]
        detail = next((ln for ln in lines if "error" in ln.lower()), lines[-1] if lines else "no output")
        raise TfplanError(f"measuring failed: {detail.removeprefix('error: ')}")
    return profile_mod.load(output)
