"""The learning price of freezing measured by a paired branch (issue 46, "a measured learning price"): does a short
branch inside a run predict what the freezing costs over the whole run?

The calibration set (benchmarks/calibration.py) measured each cell's price over whole runs: the steps the unfrozen
run needs to reach the cell's eval loss over the steps the cell took (tfrun.records.efficiency), median over the
second half. A controller cannot wait for that. What it could afford is a branch: from the run's state at step t
(weights, optimizer state, data position), K steps with the plan's freezing, compared with the same K steps
unfrozen on the same eval set. This script measures such branches, without a clock (the runs may share the
machine), and compares them with the whole-run prices of docs/results/calibration.json.

For each regime of the calibration set and data seed:
  ref-f{F}        the unfrozen run again up to the last branch point, checkpointing at every branch point (its
                  eval losses must equal the calibration set's unfrozen run's to the bit: resuming is exact);
  t{T}/{cell}-f{F}  a copy of ref's checkpoint at step T, resumed (`tfrun train --resume`) with the cell's plan
                  (`--freeze plan --plan`, the calibration set's plan file) and freeze seed F for 2K steps,
                  K the regime's eval interval: evaluations at T + K and T + 2K.
The branch's price at length k (K or 2K) is e = s(L) / k, where L is the branch's eval loss after k steps and
s(L) the steps the unfrozen run needs from T to reach L (linear between its evaluations on its running minimum,
tfrun.records.efficiency.steps_to_reach, on the calibration set's unfrozen curve, whose evaluations fall on the
same steps). A branch that loses progress reads e < 1, one that ends above the loss it started from e < 0 (at
the unfrozen curve's first slope; None where that curve does not fall there), one that ends below the unfrozen
curve's reach None. A branch without a price is left out of the rule's counts (none was).

Cells: the held-out cells of the calibration set (cap-0.9, s0-0.6, s1-0.6, whose whole-run prices exist at both
data seeds) and a control, s1-0.05 (5% of stage 1's micro-batches: the branch's own trajectory floor).

The rule, fixed before any branch ran (2026-12-07 09:28 UTC): on data seed 0 (fit), the (T, k) among
BRANCHES' points and lengths whose worst regime has the smallest mean |residual| (branch price minus whole-run
efficiency, median over the calibration set's freeze seeds) is chosen; data seed 1 is held out, and its cells
count as within tolerance as the calibration report counts them (max(the freeze seeds' range, 0.05)). The
models it is compared with: adam (the planner's), 3 of 9 held-out cells within tolerance, and the run's own first
30% (`branch` in docs/results/calibration.json), 4 of 9.

Variants and an exploratory comparison, added after the rule's result (docs/results.md, "A paired branch as the
learning price"): `CELL+rescale` runs the branch with --grad-rescale, `CELL+rescalev` also multiplies each stage's
Adam second moments at the switch by (1 + phi / c) / (1 + phi) (v_scale: what rescaling does to a gradient's
expected square, phi the stage's noise scale over the batch, c the unfrozen share); the report then sets every
branch beside the cell's own run over the same steps (local_price), which is frozen from step 0 and so never
switches.

    python benchmarks/branch_price.py --calib runs/calib --out runs/branch --regime scratch --data-seeds 0,1
    python benchmarks/branch_price.py --calib runs/calib --out runs/branch --regime scratch \
        --cells cap-0.9+rescale,s0-0.6+rescale,s1-0.6+rescale
    python benchmarks/branch_price.py --calib runs/calib --out runs/branch --report   # the table
"""

from __future__ import annotations

import argparse
import hashlib
import json
import shutil
import statistics
import sys
import tomllib
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "benchmarks"))

import torch  # noqa: E402
from calibration import REGIMES, run  # noqa: E402

from tfrun.records.compare import load_run  # noqa: E402
from tfrun.records.efficiency import curve_of, steps_to_reach  # noqa: E402

BRANCHES = {"scratch": (20, 40), "crossing": (40, 80), "finetune": (40, 80)}
"""Branch points T per regime (steps; on the regime's eval grid), early and mid-run."""
CELLS = ("cap-0.9", "s0-0.6", "s1-0.6", "s1-0.05")
CONTROL = "s1-0.05"


def _evals(folder: Path) -> dict[int, float]:
    """Steps completed -> eval loss of a finished run (or branch)."""
    return {steps: loss for steps, loss, _ in curve_of(load_run(folder).steps)}


def reference(calib: Path, where: Path, regime: dict, seed: int, last: int, freeze_seed: int) -> Path:
    """The unfrozen run again to step `last`, checkpointed on the eval grid; checked against the calibration set's.
    It names the branches' `freeze_seed` (a resumed run must keep it; an unfrozen run draws nothing with it)."""
    ref, none = where / f"ref-f{freeze_seed}", calib / f"seed{seed}" / "none"
    if not (ref / "summary.json").exists():
        shutil.rmtree(ref, ignore_errors=True)
        config = tomllib.loads((none / "config.toml").read_text())
        start = ["--init-from", config["init-from"]] if config.get("init-from") else []
        plan = calib / "plans" / "cap-0.9.json"  # (the calibration set's unfrozen runs name it: the schedule)
        run(["tfrun", "train", "--plan", str(plan), "--freeze", "none", "--model", regime["model"],
             "--steps", str(last), "--seed", str(seed), "--out", str(ref), "--quiet", "--microbatch-size",
             str(regime["mb"]), "--seq-len", str(config["seq-len"]), "--lr", regime["lr"], "--eval-every",
             str(regime["eval_every"]), "--eval-batches", str(regime["eval_batches"]), "--checkpoint-every",
             str(regime["eval_every"]), "--keep-checkpoints", "0", "--freeze-seed", str(freeze_seed), *regime["data"],
             *start])
    mine, theirs = _evals(ref), _evals(none)
    differ = {s: (v, theirs.get(s)) for s, v in mine.items() if theirs.get(s) != v}
    if differ:
        sys.exit(f"{ref}: the unfrozen run's eval losses differ from {none}'s: {differ}")
    return ref


def branch(ref: Path, folder: Path, at: int, length: int, plan: Path, freeze_seed: int, extra: list[str],
           v_scale: list[float] | None = None) -> None:
    """ref's checkpoint at step `at`, resumed with `plan` (and the options `extra`) for `length` steps into
    `folder` (skipped when done); `v_scale`: each stage's Adam second moments multiplied by it at the switch."""
    if (folder / "summary.json").exists():
        return
    shutil.rmtree(folder, ignore_errors=True)
    (folder / "checkpoints").mkdir(parents=True)
    # The branch continues ref (--resume), so it does not start from the fine-tuning base again (--init-from).
    config = [line for line in (ref / "config.toml").read_text().splitlines() if not line.startswith("init-from")]
    (folder / "config.toml").write_text("\n".join(config) + "\n")
    name = f"step{at:07d}"
    shutil.copytree(ref / "checkpoints" / name, folder / "checkpoints" / name)
    # A branch changes what a resume must keep (tfrun.records.provenance Note [resume identity]: the plan, --freeze):
    # deliberately here, so the copy's index forgets those fields, as a checkpoint from before them would.
    # And each rank's freezer forgets the plan in force (ref's, which freezes nothing: it would be restored over
    # --plan's, tfrun.freeze.freezing.Freezer.load_state_dict); its files' hashes in the index follow.
    index_path = folder / "checkpoints" / name / "index.json"
    index = json.loads(index_path.read_text())
    for field in ("plan_hash", "freeze", "freeze_seed", "grad_rescale"):
        index["run"].pop(field, None)
    for file, entry in index["files"].items():
        path = folder / "checkpoints" / name / file
        state = torch.load(path, weights_only=False)
        for key in ("ratios", "epoch", "ramp_steps", "probe"):
            state["freezer"].pop(key, None)
        if v_scale is not None:  # (1F1B, one stage a rank: rank r holds stage r)
            for moments in state["optimizer"]["state"].values():
                moments["exp_avg_sq"].mul_(v_scale[int(file[4:-3])])
        torch.save(state, path)
        entry.update(bytes=path.stat().st_size, sha256=hashlib.sha256(path.read_bytes()).hexdigest())
    index_path.write_text(json.dumps(index, indent=1))
    (folder / "checkpoints" / "latest.json").write_text(json.dumps({"step": at, "world_size": index["world_size"]}))
    run(["tfrun", "train", "--resume", str(folder), "--steps", str(at + length), "--freeze", "plan", "--plan",
         str(plan), "--freeze-seed", str(freeze_seed), "--quiet", *extra])


def v_scale(ref: Path, at: int, plan: Path) -> list[float]:
    """Per stage, what a switch to `plan` does to a gradient's expected square under --grad-rescale (the variant
    rescalev): (1 + phi / c) / (1 + phi), phi the stage's noise scale over the batch
    (median of ref's last four measurements before `at`), c = 1 - the plan's mean ratio (the share of
    micro-batches a tensor's mean is taken over)."""
    from tfplan.plan import plan as plan_mod

    measured = [row for row in load_run(ref).steps if row.get("noise_scale_tokens") and row["step"] < at][-4:]
    means = plan_mod.load(plan).mean_ratio_per_stage()
    scales = []
    for s, ratio in enumerate(means):
        phi = statistics.median(row["noise_scale_tokens"][s] for row in measured) / measured[-1]["tokens"]
        c = max(1.0 - ratio, 1e-3)
        scales.append((1.0 + phi / c) / (1.0 + phi))
    return scales


def price(base: dict[int, float], at: int, k: int, loss: float) -> float | None:
    """The branch's efficiency after k steps from `at`: steps the unfrozen curve needs from `at` to reach `loss`."""
    curve = sorted((s, v) for s, v in base.items() if s >= at)
    if loss > curve[0][1] and curve[1][1] < curve[0][1]:  # lost ground: negative, at the curve's first slope
        (s0, v0), (s1, v1) = curve[:2]
        return -(loss - v0) / (v0 - v1) * (s1 - s0) / k
    reached = steps_to_reach(curve, loss)
    return None if reached is None else (reached - at) / k


def measure(calib: Path, out: Path, name: str, seeds: list[int], freeze_seeds: list[int], cells: list[str]) -> None:
    regime = REGIMES[name]
    k = regime["eval_every"]
    for seed in seeds:
        where = out / name / f"seed{seed}"
        for f in freeze_seeds:
            ref = reference(calib / name, where, regime, seed, max(BRANCHES[name]), f)
            for at in BRANCHES[name]:
                for cell in cells:
                    folder = where / f"t{at}" / f"{cell}-f{f}"
                    plan, _, variant = cell.partition("+")
                    extra = {"": [], "rescale": ["--grad-rescale"], "rescalev": ["--grad-rescale"]}[variant]
                    path = calib / name / "plans" / f"{plan}.json"
                    scale = v_scale(ref, at, path) if variant == "rescalev" else None
                    branch(ref, folder, at, 2 * k, path, f, extra, scale)
                    print(f"{folder}: eval " + ", ".join(f"{s}: {v:.4f}" for s, v in sorted(_evals(folder).items())),
                          flush=True)


def local_price(calib: Path, name: str, seed: int, cell: str, at: int, k: int) -> float | None:
    """The cell's own run (frozen from step 0, the calibration set's, median over its freeze seeds): the unfrozen
    steps its eval loss advanced by between `at` and `at + k`, over k (its local efficiency there; exploratory,
    not part of the rule). None where its loss at `at` lies above the unfrozen curve's first evaluation (fine-tuning's
    cap 0.9 at T = 40)."""
    base = sorted(_evals(calib / name / f"seed{seed}" / "none").items())
    values = []
    for run_dir in sorted((calib / name / f"seed{seed}").glob(f"{cell}-f*")):
        evals = _evals(run_dir)
        if at in evals and at + k in evals:
            start, end = steps_to_reach(base, evals[at]), steps_to_reach(base, evals[at + k])
            if start is not None and end is not None:
                values.append((end - start) / k)
    return statistics.median(values) if values else None


def rows(calib: Path, out: Path) -> list[dict]:
    """One row per branch run measured: regime, data seed, T, cell, freeze seed, price at K and 2K."""
    found = []
    for name, points in BRANCHES.items():
        k = REGIMES[name]["eval_every"]
        for seed_dir in sorted((out / name).glob("seed*")):
            seed = int(seed_dir.name[4:])
            base = _evals(calib / name / f"seed{seed}" / "none")
            for at in points:
                for folder in sorted((seed_dir / f"t{at}").glob("*-f*")):
                    if not (folder / "summary.json").exists():
                        continue
                    cell, _, f = folder.name.rpartition("-f")
                    evals = _evals(folder)
                    found.append({"regime": name, "data_seed": seed, "at": at, "cell": cell, "freeze_seed": int(f),
                                  **{f"e{n}": price(base, at, n * k, evals[at + n * k]) if at + n * k in evals
                                     else None for n in (1, 2)},
                                  "local2": local_price(calib, name, seed, cell.partition("+")[0], at, 2 * k)})
    return found


def report(calib: Path, out: Path, json_out: Path | None) -> None:
    whole = {(c["regime"], c["data_seed"], c["cell"]): c
             for c in json.loads((ROOT / "docs/results/calibration.json").read_text())["cells"]}
    measured = rows(calib, out)
    print("regime    seed  T    cell            f  e(K)   e(2K)  cell's own over [T, T+2K]  whole-run efficiency "
          "[tolerance]  adam  first-30%")
    for r in measured:
        c = whole.get((r["regime"], r["data_seed"], r["cell"].partition("+")[0]))
        fmt = lambda v: "  -  " if v is None else f"{v:5.2f}"  # noqa: E731
        ref = "" if c is None else (f"{c['efficiency']:.2f} [{max(c.get('spread') or 0.0, 0.05):.2f}]"
                                    f"                   {c['predicted']['adam']:.2f}  {c['predicted']['branch']:.2f}")
        print(f"{r['regime']:9} {r['data_seed']:4}  {r['at']:<4} {r['cell']:16} {r['freeze_seed']}  {fmt(r['e1'])}  "
              f"{fmt(r['e2'])}  {fmt(r['local2'])}                      {ref}")
    print("\nper (T, k): mean |residual| on the fit seed (0) per regime, worst; held out (seed 1): within tolerance")
    choices = []
    for at_i in range(2):
        for n in (1, 2):
            fit, held = {}, {}
            for r in measured:
                c = whole.get((r["regime"], r["data_seed"], r["cell"]))
                value = r[f"e{n}"]
                if c is None or r["cell"] == CONTROL or r["at"] != BRANCHES[r["regime"]][at_i] or value is None:
                    continue
                residual = value - c["efficiency"]
                if r["data_seed"] == 0:
                    fit.setdefault(r["regime"], []).append(abs(residual))
                else:
                    tol = max(c.get("spread") or 0.0, 0.05)
                    held.setdefault(r["regime"], []).append(abs(residual) <= tol)
            if not fit:
                continue
            means = {g: statistics.mean(v) for g, v in fit.items()}
            worst = max(means.values())
            choices.append((worst, at_i, n))
            print(f"  T {'early' if at_i == 0 else 'mid'} k {n}K: " + ", ".join(f"{g} {v:.3f}" for g, v in
                  sorted(means.items())) + f"; worst {worst:.3f}; held out within: " + ", ".join(
                  f"{g} {sum(v)}/{len(v)}" for g, v in sorted(held.items())))
    if choices:
        worst, at_i, n = min(choices)
        print(f"chosen by the rule: T {'early' if at_i == 0 else 'mid'}, k = {n}K (worst fit regime {worst:.3f})")
    print("\nexploratory (not the rule): e(2K) against the cell's own run over [T, T+2K], both data seeds and "
          "points: mean difference, mean |difference|, pairs")
    for variant in ("", "rescale", "rescalev"):
        for name in BRANCHES:
            diffs = [r["e2"] - r["local2"] for r in measured if r["regime"] == name and r["e2"] is not None
                     and r["local2"] is not None and r["cell"].partition("+")[2] == variant
                     and r["cell"].partition("+")[0] != CONTROL]
            if diffs:
                print(f"  {variant or 'plain':8} {name:9} {statistics.mean(diffs):+.3f}  "
                      f"{statistics.mean(abs(d) for d in diffs):.3f}  {len(diffs)}")
    if json_out is not None:
        json_out.write_text(json.dumps({"branches": BRANCHES, "rows": measured}, indent=1) + "\n")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--calib", required=True, help="the calibration set's folder (benchmarks/calibration.py --out)")
    ap.add_argument("--out", required=True)
    ap.add_argument("--regime", choices=sorted(BRANCHES))
    ap.add_argument("--data-seeds", default="0,1")
    ap.add_argument("--freeze-seeds", default="0")
    ap.add_argument("--cells", default=",".join(CELLS),
                    help="comma-separated; CELL+rescale: with --grad-rescale; CELL+rescalev: also Adam's "
                    "second moments scaled at the switch (v_scale); variants are shown beside their cell's "
                    "whole-run price and left out of the rule")
    ap.add_argument("--report", action="store_true", help="print the table of the branches measured so far")
    ap.add_argument("--json", default=None, help="with --report: also write the rows here")
    args = ap.parse_args()
    calib, out = Path(args.calib), Path(args.out)
    if args.report:
        report(calib, out, None if args.json is None else Path(args.json))
        return
    if args.regime is None:
        sys.exit("--regime is required unless --report")
    measure(calib, out, args.regime, [int(s) for s in args.data_seeds.split(",")],
            [int(f) for f in args.freeze_seeds.split(",")], args.cells.split(","))


if __name__ == "__main__":
    main()
