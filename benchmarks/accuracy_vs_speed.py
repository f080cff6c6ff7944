"""The accuracy-vs-speed study (issues 12, 20, 21): every freezing method at the same seed, model, data and batch,
compared at equal training time (wall time: tfrun compare), in two regimes.

Regimes (--regime):
  finetune  the study of docs/results.md: pretrain the tiny model once (pydoc topics, no freezing, until the eval
            loss flattens; cached in OUT/base), then fine-tune from those weights on a second domain (Python
            source: --data stdlib), 1F1B, 8 micro-batches of 4 x 128 tokens (4,096 a step), 300 steps, lr 3e-4.
            Its batch sits below the measured noise scale (docs/results.md).
  scratch   early training from the random initialisation on pydoc topics, 1F1B, 16 micro-batches (8,192 tokens
            a step), 100 steps, lr 1e-3: where the noise scale is small, so the batch is several times it.
  crossing  from the random initialisation on pydoc topics, 1F1B, 8 micro-batches of 2 x 128 tokens (2,048 a
            step), 300 steps, lr 1e-3: the measured noise scale grows from about 150 tokens past the batch during
            the run (issue 38), so the right amount of freezing shrinks as it goes. (At 4,096 tokens a step it
            crossed only for a while: docs/results.md, third edition.) Its plans are solved on the shipped profile
            of that micro-batch size, profiles/tiny-cpu-2stages-mb2.json.
Methods (--methods): none; plan-C (the TimelyFreeze makespan plan at cap C from the shipped measured profile);
uniform-0.9 (the cap-0.9 plan's mean ratio everywhere); apf; autofreeze; the hybrids; goodput (tfplan solve
--objective goodput at cap 0.9 on the shipped profile with the noise section a user measures: `tfplan profile` at
the regime's starting weights and data, OUT/<regime>/seedS/profile-measured.json); timely-goodput (the
online mode re-planning for goodput as the noise scale drifts, cap 0.9); timely-0.9 (the online makespan mode);
timely-goodput-z2 (the online goodput mode whose noise re-plans need a move beyond two standard errors,
--noise-replan-z 2); timely-goodput-seeded (the online goodput mode seeded by the fixed goodput plan: in force
from the end of the warm-up, the controller moving it only on evidence, tfrun.freeze.phases Note [goodput start]);
timely-goodput-seeded-auto (the same with the default freeze policy, auto, in place of goodput's own);
timely-goodput-seeded-rescale and goodput-rescale (the seeded online mode and the fixed goodput plan with
--grad-rescale: each tensor's gradient the mean over the micro-batches that reached it, not the sum over them / M);
the ablations timely-goodput-seeded-nowarmup (--warmup-steps 0: the seed plan in force from step 0) and
timely-goodput-seeded-inert (also no noise measurement and no drift re-plans: the fixed plan run by the online mode);
timely-goodput-seeded-nowarmup-rescale (no warm-up, with --grad-rescale: its measured steps, which leave whole
micro-batches unfrozen, then no longer change a gradient's scale against Adam's second moment; docs/results.md, "A
paired branch as the learning price"; rule fixed at 10:26 UTC 2026-12-07 before it ran: better than
-nowarmup at all three scratch seeds, then crossing and fine-tuning held out); timely-goodput-seeded-measureonly (no
warm-up, the noise measured as the seeded mode does but no re-plans: what its measured steps alone cost; since
169211c their blocks' gradients for tensors the plan freezes are shadows, tfrun.freeze.noise Note [shadow
gradients], so they change no update; the run still differs from the fixed goodput plan's, whose --freeze plan
runs the auto freeze policy where the online goodput mode's orders tensors by their measured noise).

Equal time is measured twice: raw (each run's own wall time, which carries the machine's drift between runs) and
paired (`tfrun retime` over all of a seed's runs at once, then `tfrun compare --paired`: tfrun.retime Note
[paired time]); the regret of a method is its paired gap less the best plan cap's at that seed.

For each regime and seed: `tfrun compare` (table, JSON, curves), the noise scale of the unfrozen run over its
steps, APF's per-scalar statistic, and the default learning model's prediction (tfplan.cost.goodput: efficiency
from each run's realised per-stage ratios and the unfrozen run's median noise scale, times its measured speedup)
against the measured gap at equal time.

    python benchmarks/accuracy_vs_speed.py --out runs/study                                   # finetune, seed 0
    python benchmarks/accuracy_vs_speed.py --out runs/study --seeds 0,1 --methods none,plan-0.9,goodput
    python benchmarks/accuracy_vs_speed.py --out runs/study --regime scratch --seeds 0,1
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
from pathlib import Path

from noise_plot import spearman  # (benchmarks/, this script's folder)

ROOT = Path(__file__).resolve().parent.parent
PROFILES = {4: ROOT / "profiles" / "tiny-cpu-2stages.json", 2: ROOT / "profiles" / "tiny-cpu-2stages-mb2.json"}
"""The shipped measured profile of each micro-batch size (sequences of 128 tokens) the regimes use."""
MODEL, SEQ = "tiny", 128
MB_SIZE = 4  # sequences a micro-batch; a regime may set its own ("mb")
REGIMES = {
    "finetune": {"m": 8, "mb": 4, "steps": 300, "lr": "3e-4", "eval_every": 25, "data": ["--data", "stdlib"],
                 "base": True},
    "scratch": {"m": 16, "mb": 4, "steps": 100, "lr": "1e-3", "eval_every": 10, "data": [], "base": False},
    "crossing": {"m": 8, "mb": 2, "steps": 300, "lr": "1e-3", "eval_every": 25, "data": [], "base": False},
}
METHODS = {  # name -> (freeze mode, cap, extra options); goodput: a plan solved with --objective goodput
    "none": ("none", 0.9, []),
    "plan-0.9": ("plan", 0.9, []),
    "plan-0.9-rescale": ("plan", 0.9, ["--grad-rescale"]),
    "plan-0.7": ("plan", 0.7, []),
    "plan-0.6": ("plan", 0.6, []),
    "plan-0.5": ("plan", 0.5, []),
    "plan-0.3": ("plan", 0.3, []),
    "uniform-0.9": ("uniform", 0.9, []),
    "apf": ("apf", 0.9, []),
    "autofreeze": ("autofreeze", 0.9, []),
    "timely+apf-0.9": ("timely+apf", 0.9, []),
    "timely+autofreeze-0.9": ("timely+autofreeze", 0.9, []),
    "goodput": ("plan", 0.9, []),
    "timely-goodput": ("timely", 0.9, ["--objective", "goodput", "--max-freeze-ratio", "0.9"]),
    "timely-0.9": ("timely", 0.9, ["--max-freeze-ratio", "0.9"]),
    # the online goodput mode whose noise re-plans need a move beyond 2 standard errors (Note [noise gate])
    "timely-goodput-z2": ("timely", 0.9, ["--objective", "goodput", "--max-freeze-ratio", "0.9",
                                          "--noise-replan-z", "2"]),
    # the online goodput mode started from the fixed goodput plan (its seed plan) instead of its own monitor and probe;
    # --warmup-steps 5 was its default when these runs were made (tfrun.freeze.phases Note [goodput start])
    "timely-goodput-seeded": ("timely", 0.9, ["--objective", "goodput", "--max-freeze-ratio", "0.9",
                                              "--warmup-steps", "5"]),
    "timely-goodput-seeded-auto": ("timely", 0.9, ["--objective", "goodput", "--max-freeze-ratio", "0.9",
                                                   "--warmup-steps", "5", "--freeze-policy", "auto"]),
    "timely-goodput-seeded-rescale": ("timely", 0.9, ["--objective", "goodput", "--max-freeze-ratio", "0.9",
                                                      "--warmup-steps", "5", "--grad-rescale"]),
    "goodput-rescale": ("plan", 0.9, ["--grad-rescale"]),
    "timely-goodput-seeded-nowarmup": ("timely", 0.9, ["--objective", "goodput", "--max-freeze-ratio", "0.9",
                                                       "--warmup-steps", "0"]),
    "timely-goodput-seeded-nowarmup-rescale": ("timely", 0.9, ["--objective", "goodput", "--max-freeze-ratio", "0.9",
                                                               "--warmup-steps", "0", "--grad-rescale"]),
    "timely-goodput-seeded-inert": ("timely", 0.9, ["--objective", "goodput", "--max-freeze-ratio", "0.9",
                                                    "--warmup-steps", "0", "--noise-every", "0",
                                                    "--noise-replan-z", "0", "--replan-threshold", "100"]),
    # the seeded mode's measured steps without its re-plans: splits -nowarmup's loss against the fixed plan
    "timely-goodput-seeded-measureonly": ("timely", 0.9, ["--objective", "goodput", "--max-freeze-ratio", "0.9",
                                                          "--warmup-steps", "0", "--noise-replan-z", "1e9",
                                                          "--replan-threshold", "100"]),
}
# the methods whose plan is the seed's goodput plan
GOODPUT_SEEDED = ("goodput", "goodput-rescale", *(m for m in METHODS if m.startswith("timely-goodput-seeded")))
CAPS = ("plan-0.3", "plan-0.6", "plan-0.9")  # the fixed plans the regret is taken against
DEFAULT_METHODS = "none,plan-0.3,plan-0.6,plan-0.9,uniform-0.9,apf,autofreeze,goodput"


def run(cmd: list[str]) -> str:
    proc = subprocess.run([sys.executable, "-m", *cmd], capture_output=True, text=True)
    if proc.returncode:
        sys.exit(f"failed: {' '.join(cmd)}\n{proc.stderr[-3000:]}")
    return proc.stdout


def train(out: Path, plan: Path, freeze: str, steps: int, seed: int, extra: list[str]) -> dict:
    if not (out / "summary.json").exists():
        run(["tfrun", "train", "--plan", str(plan), "--freeze", freeze, "--steps", str(steps), "--seed", str(seed),
             "--out", str(out), "--quiet", "--microbatch-size", str(MB_SIZE), "--seq-len", str(SEQ), *extra])
    return json.loads((out / "summary.json").read_text())


def rows(folder: Path) -> list[dict]:
    return [r for r in (json.loads(line) for line in (folder / "metrics.jsonl").read_text().splitlines())
            if "event" not in r]


def pretrain(out: Path, plan: Path, flat: float, max_steps: int, chunk: int = 200) -> Path:
    """Train without freezing in chunks (resuming) until the eval loss improved by less than `flat` (relative)
    over the last chunk; the base checkpoint is made once and reused."""
    base = out / "base"
    done = base / "done.json"
    if done.exists():
        return base
    steps = chunk
    while True:
        extra = ["--eval-every", "50", "--checkpoint-every", str(chunk)]
        if (base / "checkpoints" / "latest.json").exists():
            extra += ["--resume", str(base)]
        run(["tfrun", "train", "--plan", str(plan), "--freeze", "none", "--steps", str(steps), "--out", str(base),
             "--quiet", "--microbatch-size", str(MB_SIZE), "--seq-len", str(SEQ), "--lr", "1e-3", *extra])
        points = [(r["step"], r["eval_loss"]) for r in rows(base) if "eval_loss" in r]
        if steps == chunk:
            steps += chunk
            continue
        last, before = points[-1][1], next(loss for step, loss in reversed(points) if step <= steps - chunk - 1)
        gain = (before - last) / before
        print(f"pretraining: {steps} steps, eval loss {last:.4f} ({gain:.2%} better than {chunk} steps before)",
              flush=True)
        if gain < flat or steps >= max_steps:
            done.write_text(json.dumps({"steps": steps, "eval_loss": last, "last_chunk_gain": gain}))
            return base
        steps += chunk


def noise_profile(folder: Path, start: list[str], regime: dict) -> Path:
    """The shipped profile with the noise section a user measures: `tfplan profile` at the regime's starting
    weights and data (its measuring runs at learning rate 0: tfrun.cli.profiling Note [profile at fixed weights]),
    its noise section (in the default learning model) put into the shipped profile, whose stage times the cap plans
    use too."""
    measured = folder / "profile-measured.json"
    if not measured.exists():
        run(["tfplan", "profile", "--model", MODEL, "--stages", "2", "--microbatches", str(regime["m"]),
             "--microbatch-size", str(MB_SIZE), "--seq-len", str(SEQ), *start, "-o", str(measured), "--json"])
    prof = json.loads(PROFILES[MB_SIZE].read_text())
    prof["noise"] = json.loads(measured.read_text())["noise"]
    path = folder / "profile-noise.json"
    path.write_text(json.dumps(prof, indent=1))
    return path


def predictions(folders: dict[str, Path], compared: dict, batch_tokens: float) -> str:
    """The learning model's goodput for every run (efficiency from its realised per-stage ratios at the unfrozen
    run's median noise scale, times its measured speedup) against its measured gap at equal time: the paired
    speedup and gap where the runs were re-timed (the raw ones carry the machine's drift between runs), else raw."""
    from tfplan.cost.goodput import measured, progress

    none = json.loads((folders["none"] / "summary.json").read_text())
    noise = measured(none["noise_scale_tokens"], none["grad_sq_share"], MB_SIZE * SEQ, none.get("update_share"))
    base = progress([0.0] * len(noise.grad_sq_share), batch_tokens, noise)
    lines = [f"learning model {noise.learning_model} (tfplan.cost.goodput Note [learning models]); noise scale of the "
             f"unfrozen run (median over its measured steps): "
             f"{', '.join(f'{x:.0f}' for x in noise.noise_scale_tokens)} tokens per stage, |G|^2 shares "
             f"{', '.join(f'{x:.2f}' for x in noise.grad_sq_share)}; batch {batch_tokens:.0f} tokens",
             "forward ms: the run's median forward per stage (never frozen, so its change against the unfrozen "
             "run's is the machine's drift between runs, less 1-3% for frozen micro-batches: docs/benchmarks.md)",
             f"{'run':24s} {'ratios':>11s} {'forward ms':>12s} {'efficiency':>10s} {'speedup':>8s} {'goodput':>8s} "
             f"{'gap at equal time':>18s}  agree"]
    paired = any(r.get("paired_speedup") is not None for r in compared["runs"])
    lines.insert(2, "speedup and gap: " + ("paired (tfrun retime), - where a repeat of the run ended past the "
                                           "baseline's last evaluation" if paired else "raw (wall time)"))
    table = []
    for row in compared["runs"]:
        name = Path(row["dir"]).name
        ratios = row["freeze_ratio_per_stage"] or [0.0] * len(noise.grad_sq_share)
        eff = progress(ratios, batch_tokens, noise) / base
        speedup = row["paired_speedup"] if paired else row["speedup"]
        gap = row["eval_gap_same_time_paired"] if paired else row["eval_gap_same_time"]
        good = None if speedup is None else eff * speedup  # (a run the re-timing left out has no speedup)
        agree = "-" if gap is None or good is None or name == "none" else ("yes" if (good > 1) == (gap < 0) else "no")
        table.append((name, good, gap))
        kinds = json.loads((Path(row["dir"]) / "timings.json").read_text())["by_stage_kind_ms"]
        forward = " ".join(f"{v:.1f}" for k, v in sorted(kinds.items()) if k.endswith("F"))
        lines.append(f"{name:24s} {' '.join(f'{r:.2f}' for r in ratios):>11s} {forward:>12s} {eff:10.3f} "
                     f"{'-' if speedup is None else f'{speedup:.3f}':>8s} {'-' if good is None else f'{good:.3f}':>8s} "
                     f"{'-' if gap is None else f'{gap:+.2%}':>18s}  {agree}")
    ranked = [(g, gap) for name, g, gap in table if gap is not None and g is not None]
    if len(ranked) >= 3:
        lines.append(f"rank correlation (Spearman) of predicted goodput with the measured gain at equal time "
                     f"(-gap): {spearman([g for g, _ in ranked], [-gap for _, gap in ranked]):+.2f} over "
                     f"{len(ranked)} runs")
    return "\n".join(lines)


def noise_trajectory(folder: Path) -> str:
    """The unfrozen run's smoothed noise scale per stage over its measured steps (every ~tenth)."""
    measured = [r for r in rows(folder) if "noise_scale_tokens" in r]
    picked = measured[:: max(1, len(measured) // 10)] + measured[-1:]
    return "noise scale of the unfrozen run by step (tokens, per stage): " + "; ".join(
        f"{r['step']}: {', '.join('-' if x is None else f'{x:.0f}' for x in r['noise_scale_tokens'])}" for r in picked)


def apf_report(folder: Path, shares=(0.1, 0.2, 0.3, 0.5, 0.7, 0.9)) -> str:
    """APF's per-scalar statistic over a run (freeze_stats.json): per check, the smallest, median and largest
    share of stable scalars over the tensors, and for each tensor-level share the first check at which some
    tensor reached it (what --apf-stable-share at that value would have frozen first)."""
    tensors = json.loads((folder / "freeze_stats.json").read_text())["tensors"]
    by_step: dict[int, list[float]] = {}
    for t in tensors:
        for step, share in t.get("apf_stable_share_history", []):
            by_step.setdefault(int(step), []).append(share)
    lines = ["APF per-scalar statistic (share of a tensor's scalars below the threshold), over the tensors:"]
    steps = sorted(by_step)
    for step in steps[:: max(1, len(steps) // 10)] + steps[-1:]:
        v = sorted(by_step[step])
        lines.append(f"  check after step {step + 1:4d}: min {v[0]:.3f}  median {statistics.median(v):.3f}  "
                     f"max {v[-1]:.3f}  ({len(v)} tensors)")
    for share in shares:
        first = next((step for step in steps if max(by_step[step]) >= share), None)
        reached = sum(1 for t in tensors if any(x >= share for _, x in t.get("apf_stable_share_history", [])))
        lines.append(f"  a tensor-level share of {share:.1f}: first reached after step "
                     f"{first + 1 if first is not None else '-'}, by {reached} of {len(tensors)} tensors in the run")
    return "\n".join(lines)


def regret_table(seeds: dict[int, dict]) -> str:
    """Per method (matched by its folder name, so a seed may run fewer methods): the paired gap at equal time per
    seed, its regret against the best plan cap at that seed (the best fixed plan in hindsight), the raw gap beside
    it, and the mean regret over the seeds that ran both the method and a cap."""
    lines = ["gap at equal time, paired (raw), and regret against the best of " + ", ".join(CAPS) + " per seed:"]
    by_seed = {s: {Path(r["dir"]).name: r for r in c["runs"]} for s, c in seeds.items()}
    best = {s: min((runs[c]["eval_gap_same_time_paired"] for c in CAPS
                    if c in runs and runs[c].get("eval_gap_same_time_paired") is not None), default=None)
            for s, runs in by_seed.items()}
    names = list(dict.fromkeys(n for runs in by_seed.values() for n in runs))
    for name in names:
        cells, regrets = [], []
        for s, runs in by_seed.items():
            if name not in runs:
                cells.append(f"seed {s}: not run")
                continue
            gap, raw = runs[name].get("eval_gap_same_time_paired"), runs[name]["eval_gap_same_time"]
            regret = None if gap is None or best[s] is None else gap - best[s]
            if regret is not None:
                regrets.append(regret)
            cells.append(f"seed {s}: {'-' if gap is None else f'{gap:+.2%}'} ({'-' if raw is None else f'{raw:+.2%}'})"
                         f" regret {'-' if regret is None else f'{regret:+.2%}'}")
        mean = f"mean regret {statistics.fmean(regrets):+.2%} over {len(regrets)}" if regrets else "mean regret -"
        lines.append(f"  {name:16s} " + "; ".join(cells) + f"; {mean}")
    return "\n".join(lines)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--out", required=True)
    ap.add_argument("--regime", default="finetune", choices=sorted(REGIMES))
    ap.add_argument("--steps", type=int, default=None, help="steps per method (default: the regime's)")
    ap.add_argument("--seeds", default="0")
    ap.add_argument("--methods", default=DEFAULT_METHODS)
    ap.add_argument("--flat", type=float, default=0.01, help="pretraining stops below this gain per 200 steps")
    ap.add_argument("--max-pretrain", type=int, default=3000)
    ap.add_argument("--retime-every", type=int, default=20, help="tfrun retime --sample-every (0: no paired gap)")
    ap.add_argument("--retime-repeats", type=int, default=3)
    args = ap.parse_args()
    global MB_SIZE
    regime = REGIMES[args.regime]
    MB_SIZE = regime["mb"]
    m, steps = regime["m"], args.steps or regime["steps"]
    out = Path(args.out)
    where = out / args.regime
    where.mkdir(parents=True, exist_ok=True)
    print(f"accuracy vs speed, {args.regime}: tiny model, 2 gloo ranks, 1F1B, M = {m}, {MB_SIZE} x {SEQ} tokens, "
          f"{steps} steps; load average {os.getloadavg()[0]:.2f}", flush=True)
    plans = {}
    for cap in sorted({c for _, c, _ in METHODS.values()}):
        plans[cap] = where / f"plan-{cap}.json"
        if not plans[cap].exists():
            run(["tfplan", "solve", "-p", str(PROFILES[MB_SIZE]), "-s", "1f1b", "-m", str(m), "-c", str(cap), "-o",
                 str(plans[cap]), "--json"])
    start = list(regime["data"])
    if regime["base"]:
        start += ["--init-from", str(pretrain(out, out / "plan-base.json" if (out / "plan-base.json").exists()
                                              else plans[0.9], args.flat, args.max_pretrain))]
    for seed in (int(s) for s in args.seeds.split(",")):
        folders: dict[str, Path] = {}
        for name in args.methods.split(","):
            freeze, cap, extra = METHODS[name]
            plan = plans[cap]
            if name in GOODPUT_SEEDED:
                plan = where / f"seed{seed}" / "plan-goodput.json"
                if not plan.exists():
                    prof = noise_profile(where / f"seed{seed}", start, regime)
                    print(run(["tfplan", "solve", "-p", str(prof), "-s", "1f1b", "-m", str(m), "-c", str(cap),
                               "--objective", "goodput", "-o", str(plan)]), flush=True)
            folder = where / f"seed{seed}" / name
            train(folder, plan, freeze, steps, seed,
                  [*start, "--eval-every", str(regime["eval_every"]), "--lr", regime["lr"], *extra])
            folders[name] = folder
            print(f"seed {seed} {name} done", flush=True)
            if freeze == "apf":
                report = apf_report(folder)
                (where / f"seed{seed}-{name}-apf.txt").write_text(report + "\n")
                print(report, flush=True)
        names = [str(f) for f in folders.values()]
        if len(names) < 2:  # (one method: its runs stay for a later call with the others)
            continue
        paired = []
        if args.retime_every and "none" in folders:
            retimed = where / f"seed{seed}-retime"
            if not (retimed / "retime.json").exists():
                print(run(["tfrun", "retime", *names, "--out", str(retimed), "--sample-every",
                           str(args.retime_every), "--repeats", str(args.retime_repeats)]), flush=True)
            paired = ["--paired", str(retimed / "retime.json")]
        table = run(["tfrun", "compare", *names, "--per-stage", "--plot", str(where / f"seed{seed}.png"), *paired])
        compared = json.loads(run(["tfrun", "compare", *names, "--json", *paired]))
        (where / f"seed{seed}.txt").write_text(table)
        (where / f"seed{seed}.json").write_text(json.dumps(compared, indent=1))
        print(table, flush=True)
        if "none" in folders:
            text = noise_trajectory(folders["none"]) + "\n" + predictions(folders, compared,
                                                                           float(m * MB_SIZE * SEQ))
            (where / f"seed{seed}-predictions.txt").write_text(text + "\n")
            print(text, flush=True)
    if not all((where / f"seed{s}.json").exists() for s in args.seeds.split(",")):
        return
    seeds = {int(s): json.loads((where / f"seed{s}.json").read_text()) for s in args.seeds.split(",")}
    print(regret_table(seeds), flush=True)

if __name__ == "__main__":
    main()
