"""What measuring the gradient noise scale costs a step (tfrun.freeze.noise; issue 21: at most 3% at the default
period).

Runs of the tiny model on 2 gloo ranks (1F1B, 8 micro-batches of 4 x 128 tokens, unfrozen), alternating
--noise-every 0 (off: the hooks only return), the default period and 1 (every step), three rounds in the
order off, default, every, then reversed, so that no setting always runs first. Each run's median step time
(its timed steps' mean step_time_ms, from metrics.jsonl: a median would hide a cost paid on one step in five)
is one sample; the figure is the median over the rounds of each setting's difference to the round's `off`
run, in ms and in % of the step. `--measures microbatch,sequence` times each `--noise-measure` (tfrun.freeze.noise
Note [noise measure]) at both periods, all settings alternated in each round.

`--in-process` instead times what measuring adds to one stage's step in this process (the tiny model's stages 0
and 1, 8 micro-batches of 4 x 128 tokens, forward and backward, one thread; the meter off, measuring per
micro-batch and per sequence, alternated, the median of `--repeats`): the added compute without the pipeline's
waits or a loaded machine's noise. At period K a run pays about that share over K (a little less: the
pipeline's bubbles do not grow).

    python benchmarks/noise_cost.py --steps 40 --rounds 3 --out runs/noise-cost
    python benchmarks/noise_cost.py --steps 30 --measures microbatch,sequence --out runs/noise-cost-seq
    python benchmarks/noise_cost.py --in-process --repeats 10
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
PROFILE = ROOT / "profiles" / "tiny-cpu-2stages.json"


def in_process(repeats: int, m: int = 8) -> None:
    """Median ms of one step's forwards and backwards (m micro-batches) per stage: meter off, per micro-batch, per
    sequence (with its subset of micro-batches, Note [sequence subset])."""
    import time

    import torch

    from tfrun.freeze.candidates import candidates
    from tfrun.freeze.noise import NoiseMeter
    from tfrun.models import MODELS, build_stage, loss_fn

    torch.set_num_threads(1)
    torch.manual_seed(0)
    for s in (0, 1):
        stage = build_stage(MODELS["tiny"], s, 2, 0)
        x = torch.randint(0, 256, (4, 128)) if s == 0 else torch.randn(4, 128, 256, requires_grad=True)
        y = torch.randint(0, 256, (4, 128))
        meters = {name: NoiseMeter({s: stage}, {s: candidates(stage)}, num_microbatches=m, microbatch_tokens=512,
                                   every=0, measure=name) for name in ("microbatch", "sequence")}
        times: dict[str, list[float]] = {"off": [], "microbatch": [], "sequence": []}
        for r in range(repeats + 1):
            for name in (list(times) if r % 2 == 0 else list(reversed(times))):
                for measure, meter in meters.items():
                    meter.begin_step(0, force=measure == name)  # every = 0: only a forced step is measured
                start = time.perf_counter()
                for _ in range(m):
                    out = stage(x)
                    if s == 1:
                        loss_fn(out, y).backward()
                    else:
                        out.backward(torch.ones_like(out) / out.numel())
                if r >= 1:  # one warm-up round
                    times[name].append((time.perf_counter() - start) * 1e3)
                stage.zero_grad(set_to_none=True)
        base = statistics.median(times["off"])
        added = {name: statistics.median(times[name]) - base for name in ("microbatch", "sequence")}
        print(f"stage {s}: one step's {m} forwards and backwards, median of {repeats}: off {base:.0f} ms; measured "
              + "; ".join(f"{name} {ms:+.0f} ms ({ms / base:+.1%}; at --noise-every 5 {ms / base / 5:+.1%})"
                          for name, ms in added.items()), flush=True)
        for meter in meters.values():
            meter.close()


def main() -> None:
    from tfrun.config.train_config import NOISE_EVERY

    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--steps", type=int, default=40)
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--out", default="runs/noise-cost")
    ap.add_argument("--measures", default="microbatch", help="--noise-measure values to time, comma-separated")
    ap.add_argument("--in-process", action="store_true", help="time one stage's micro-batch in this process")
    ap.add_argument("--repeats", type=int, default=10)
    args = ap.parse_args()
    if args.in_process:
        in_process(args.repeats)
        return
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    plan = out / "plan.json"
    if not plan.exists():
        subprocess.run([sys.executable, "-m", "tfplan", "solve", "-p", str(PROFILE), "-s", "1f1b", "-m", "8", "-o",
                        str(plan), "--json"], check=True, capture_output=True)
    measures = args.measures.split(",")
    settings: dict[str, tuple[int, str]] = {"off": (0, measures[0])}
    for measure in measures:
        suffix = "" if measures == ["microbatch"] else f" {measure}"
        settings[f"default{suffix}"] = (NOISE_EVERY, measure)
        settings[f"every step{suffix}"] = (1, measure)
    print(f"noise-scale cost, tiny model, 2 ranks, 1F1B M=8, {args.steps} steps a run, load average "
          f"{os.getloadavg()[0]:.2f}", flush=True)
    samples: dict[str, list[float]] = {k: [] for k in settings}
    for r in range(args.rounds):
        order = list(settings) if r % 2 == 0 else list(reversed(settings))
        for name in order:
            folder = out / f"round{r}-{name.replace(' ', '-')}"
            if not (folder / "summary.json").exists():
                subprocess.run([sys.executable, "-m", "tfrun", "train", "--plan", str(plan), "--freeze", "none",
                                "--steps", str(args.steps), "--noise-every", str(settings[name][0]),
                                "--noise-measure", settings[name][1], "--out", str(folder), "--quiet"], check=True,
                               capture_output=True)
            summary = json.loads((folder / "summary.json").read_text())
            rows = [json.loads(line) for line in (folder / "metrics.jsonl").read_text().splitlines()]
            mean = statistics.fmean(r["step_time_ms"] for r in rows if r.get("timed"))
            samples[name].append(mean)
            print(f"  round {r} {name:21s} step mean {mean:.1f} ms, median {summary['step_time_ms']:.1f} ms "
                  f"(noise measured on {summary.get('noise_steps', 0)} steps)", flush=True)
    for name in (n for n in settings if n != "off"):
        diffs = [b - a for a, b in zip(samples["off"], samples[name])]
        rel = [d / a for d, a in zip(diffs, samples["off"])]
        every, measure = settings[name]
        print(f"{name} (--noise-every {every} --noise-measure {measure}): +{statistics.median(diffs):.1f} ms a step "
              f"({statistics.median(rel):+.1%}; rounds {', '.join(f'{x:+.1%}' for x in rel)})")
    off = samples["off"]
    print(f"off: mean step {statistics.median(off):.1f} ms (rounds {', '.join(f'{x:.1f}' for x in off)})")


if __name__ == "__main__":
    main()
