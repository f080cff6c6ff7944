"""The learning price of freezing, measured from loss curves alone (issue 45): the calibration set.

Every cell freezes a fixed, known amount; its learning efficiency is read from exact eval-loss curves against the
unfrozen run of the same data seed (tfrun.records.efficiency: steps the unfrozen run needs to reach the cell's
eval loss over the steps the cell took), so no run here reads a clock and the runs may share the machine.

Cells (--cells): `s{S}-{R}` freezes stage S alone at ratio R in every micro-batch (the other stages unfrozen;
tfplan.plan.plan.with_stage_ratios on the regime's plan), for R in 0.3 / 0.6 / 0.9 and every stage; `cap-{C}`
is the TimelyFreeze makespan plan at cap C (tfplan solve on the regime's profile), for C in 0.3 / 0.6 / 0.9.
Each cell runs at every --freeze-seeds value (the same data and initial weights, another draw of which
micro-batches and tensors freeze: `tfrun train --freeze-seed`), beside one unfrozen run per --data-seeds value.

Regimes (--regime), sized so that the second half of each run is past its steepest fall:
  scratch   tiny, 2 stages, from the random initialisation on pydoc topics, 16 micro-batches of 4 x 128 tokens
            (8,192 a step), lr 1e-3, 100 steps (the study's), eval every 10 steps on 256 sequences.
  crossing  tiny, 2 stages, from scratch, 8 micro-batches of 2 x 128 (2,048 a step), lr 1e-3, 200 steps (the
            study ran 300; the noise scale crosses the batch by step 100), eval every 20 on 256 sequences.
  finetune  tiny, 2 stages, from the study's base (600 steps of pydoc topics, benchmarks/accuracy_vs_speed.py) on
            the standard library's source, 8 x 4 x 128 (4,096 a step), lr 3e-4, 200 steps (the study ran 300),
            eval every 20 on 256 sequences.
  small     the `small` model (8 blocks, width 384), 4 stages on 4 ranks (2 cores oversubscribed: no clock is
            read), from scratch on pydoc topics, 8 x 2 x 128 (2,048 a step), lr 1e-3, 100 steps, eval every 10
            on 256 sequences; its profile is measured once here (tfplan profile) for the cap plans.
  small-lr3e-4  the same at lr 3e-4, with small's profile and plans (copied into its folder, so that it freezes
            exactly as `small` does): at lr 1e-3 the small model's unfrozen eval loss is not monotone.
All use 1F1B, AdamW at a constant learning rate, and the default noise measurement (every 5 steps), so every run
records the inputs the learning models read.

    python benchmarks/calibration.py --out runs/calib --regime scratch                      # every cell, 3 seeds
    python benchmarks/calibration.py --out runs/calib --regime scratch --data-seeds 1 --freeze-seeds 0 \\
        --cells s0-0.6,s1-0.6,cap-0.9
    python benchmarks/calibration_report.py --out runs/calib                                # the tables
"""

from __future__ import annotations

import argparse
import json
import shutil
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

REGIMES = {
    "scratch": {"model": "tiny", "stages": 2, "m": 16, "mb": 4, "steps": 100, "lr": "1e-3", "eval_every": 10,
                "eval_batches": 4, "data": [], "profile": "tiny-cpu-2stages.json"},
    "crossing": {"model": "tiny", "stages": 2, "m": 8, "mb": 2, "steps": 200, "lr": "1e-3", "eval_every": 20,
                 "eval_batches": 16, "data": [], "profile": "tiny-cpu-2stages-mb2.json"},
    "finetune": {"model": "tiny", "stages": 2, "m": 8, "mb": 4, "steps": 200, "lr": "3e-4", "eval_every": 20,
                 "eval_batches": 8, "data": ["--data", "stdlib"], "profile": "tiny-cpu-2stages.json", "base": True},
    "small": {"model": "small", "stages": 4, "m": 8, "mb": 2, "steps": 100, "lr": "1e-3", "eval_every": 10,
              "eval_batches": 16, "data": [], "profile": None},
}
# The small model at a third of the step size: at lr 1e-3 its unfrozen eval loss rose between evaluations in the
# middle of the run (data seed 1: 3.140 -> 3.248 at steps 30-40, flat to step 80), so "the steps the unfrozen run
# needs" was ill-defined there (docs/results.md, fourth edition, "The fourth regime at a second data seed").
REGIMES["small-lr3e-4"] = {**REGIMES["small"], "lr": "3e-4", "plans_from": "small"}
SEQ = 128
RATIOS = (0.3, 0.6, 0.9)
CAPS = (0.3, 0.6, 0.9)
BASE_STEPS = 600
"""Pretraining steps of the fine-tuning base (the third study's)."""


def cells_of(regime: dict) -> list[str]:
    """Every cell of a regime: each stage alone at each ratio, then the cap plans."""
    return [f"s{s}-{r}" for s in range(regime["stages"]) for r in RATIOS] + [f"cap-{c}" for c in CAPS]


def _extra_cell(cell: str, regime: dict) -> bool:
    """A one-stage cell at a ratio outside RATIOS (e.g. s1-0.05, a control that barely freezes)."""
    kind, _, value = cell.partition("-")
    try:
        return kind[0] == "s" and 0 <= int(kind[1:]) < regime["stages"] and 0 < float(value) <= 1
    except ValueError:
        return False


def run(cmd: list[str]) -> str:
    proc = subprocess.run([sys.executable, "-m", *cmd], capture_output=True, text=True)
    if proc.returncode:
        sys.exit(f"failed: {' '.join(cmd)}\n{proc.stderr[-3000:]}")
    return proc.stdout


def profile_of(name: str, regime: dict, where: Path) -> Path:
    """The regime's profile: the shipped one, or (small) measured here once."""
    if regime["profile"] is not None:
        return ROOT / "profiles" / regime["profile"]
    path = where / "profile.json"
    if not path.exists():
        run(["tfplan", "profile", "--model", regime["model"], "--stages", str(regime["stages"]), "--microbatches",
             str(regime["m"]), "--microbatch-size", str(regime["mb"]), "--seq-len", str(SEQ), "-o", str(path)])
    return path


def plan_of(cell: str, regime: dict, profile: Path, where: Path) -> Path:
    """The cell's plan file (made once): a cap plan solved by tfplan, or a one-stage plan at a fixed ratio."""
    from tfplan.plan import plan as plan_mod

    path = where / "plans" / f"{cell}.json"
    if path.exists():
        return path
    path.parent.mkdir(parents=True, exist_ok=True)
    kind, value = cell.split("-")
    cap = value if kind == "cap" else "0.9"
    solved = where / "plans" / f"cap-{cap}.json"
    if not solved.exists():
        run(["tfplan", "solve", "-p", str(profile), "-s", "1f1b", "-m", str(regime["m"]), "-c", cap, "-o",
             str(solved), "--json"])
    if kind == "cap":
        return solved
    stage = int(kind[1:])
    ratios = [float(value) if s == stage else 0.0 for s in range(regime["stages"])]
    plan_mod.write(plan_mod.with_stage_ratios(plan_mod.load(solved), ratios), path)
    return path


def base_of(out: Path, regime: dict, plan: Path) -> list[str]:
    """The fine-tuning base's --init-from (pretrained once, shared with benchmarks/accuracy_vs_speed.py's layout)."""
    if not regime.get("base"):
        return []
    sys.path.insert(0, str(ROOT / "benchmarks"))
    import accuracy_vs_speed

    accuracy_vs_speed.MB_SIZE = regime["mb"]
    return ["--init-from", str(accuracy_vs_speed.pretrain(out, plan, 0.0, BASE_STEPS))]


def train(folder: Path, plan: Path, freeze: str, regime: dict, seed: int, freeze_seed: int | None,
          start: list[str]) -> None:
    """One run (skipped when its summary exists: the set is built up over several calls)."""
    if (folder / "summary.json").exists():
        return
    shutil.rmtree(folder, ignore_errors=True)  # a run cut off before its end (the set may be stopped any time)
    extra = [] if freeze_seed is None else ["--freeze-seed", str(freeze_seed)]
    t0 = time.time()
    run(["tfrun", "train", "--plan", str(plan), "--freeze", freeze, "--model", regime["model"], "--steps",
         str(regime["steps"]), "--seed", str(seed), "--out", str(folder), "--quiet", "--microbatch-size",
         str(regime["mb"]), "--seq-len", str(SEQ), "--lr", regime["lr"], "--eval-every", str(regime["eval_every"]),
         "--eval-batches", str(regime["eval_batches"]), *regime["data"], *start, *extra])
    summary = json.loads((folder / "summary.json").read_text())
    print(f"{folder}: eval {summary.get('final_eval_loss'):.4f}, realised "
          f"{', '.join(f'{r:.2f}' for r in summary.get('realised_freeze_ratio') or [])} ({time.time() - t0:.0f} s)",
          flush=True)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--out", required=True)
    ap.add_argument("--regime", required=True, choices=sorted(REGIMES))
    ap.add_argument("--data-seeds", default="0")
    ap.add_argument("--freeze-seeds", default="0,1,2")
    ap.add_argument("--cells", default=None, help="comma-separated (default: every cell of the regime)")
    args = ap.parse_args()
    regime = REGIMES[args.regime]
    out = Path(args.out)
    where = out / args.regime
    where.mkdir(parents=True, exist_ok=True)
    if regime.get("plans_from") and not (where / "plans").exists():  # the same freezing as that regime
        source = out / regime["plans_from"]
        if not (source / "plans").is_dir():
            sys.exit(f"--regime {args.regime}: run --regime {regime['plans_from']} first (its plans are shared)")
        shutil.copy(source / "profile.json", where / "profile.json")
        shutil.copytree(source / "plans", where / "plans")
    cells = args.cells.split(",") if args.cells else cells_of(regime)
    unknown = sorted(c for c in set(cells) - set(cells_of(regime)) if not _extra_cell(c, regime))
    if unknown:
        sys.exit(f"--cells: unknown for {args.regime}: {', '.join(unknown)} (known: {', '.join(cells_of(regime))})")
    profile = profile_of(args.regime, regime, where)
    plans = {cell: plan_of(cell, regime, profile, where) for cell in cells}
    base_plan = plan_of("cap-0.9", regime, profile, where)
    start = base_of(out, regime, base_plan)
    for seed in (int(s) for s in args.data_seeds.split(",")):
        folder = where / f"seed{seed}"
        train(folder / "none", base_plan, "none", regime, seed, None, start)
        for freeze_seed in (int(f) for f in args.freeze_seeds.split(",")):
            for cell in cells:
                train(folder / f"{cell}-f{freeze_seed}", plans[cell], "plan", regime, seed, freeze_seed, start)


if __name__ == "__main__":
    main()
