"""The learning price of freezing, measured (benchmarks/calibration.py's runs) against the learning models' predictions.

For every cell of every regime and data seed: the measured efficiency (tfrun.records.efficiency: unfrozen steps
to the cell's eval loss over its steps, median over the second half) per freeze seed, their median and spread,
the eval set's own error, and each learning model's prediction from measured inputs: the unfrozen run's noise
scales and |G|^2 shares at each measured step (per stage from metrics.jsonl; per tensor, noise_tensors.json's
end-of-run split of each stage) and the cell's realised freezing at each step (per stage from metrics.jsonl, per
tensor from frozen_sets.jsonl: the micro-batches each tensor learnt from).

The baseline (tfrun.records.efficiency Note [trajectory floor]): the pointwise median of the unfrozen run and the
controls (`s0-0.05`, `s1-0.05` at several freeze seeds: calibration.py --cells); the efficiency against the
unfrozen run alone is kept beside it (`efficiency_raw`).

Like for like: the measured efficiency is cumulative (steps to a loss reached over the whole run so far), while a
model gives the instantaneous one (progress of one step at that step's noise). So a model's prediction for a run
is its instantaneous efficiency averaged over the steps before each evaluation (a run that keeps a share e(t) of
each step's progress has made sum_t e(t) unfrozen steps' progress after s steps), with the noise of each step
held from its last measurement, and then the median over the same second-half evaluations as the measurement.

The models (docs/cost-model.md says which one the planner uses, and why):
  free              freezing costs no learning: e = 1
  kept              every frozen sample is lost: e = the |G|^2-weighted kept share (N -> infinity)
  mccandlish        McCandlish's b / (b + N) per stage at the stage's kept batch, |G|^2 shares (the third study's)
  mccandlish-tensor the same per tensor, at each tensor's realised kept batch
  momentum          mccandlish with Adam's first moment averaging (1 + b1) / (1 - b1) steps of gradient noise
                    (N / 19 at b1 = 0.9)
  momentum-tensor   the same per tensor
  fit-tensor        mccandlish-tensor with N scaled by one factor fitted (least squares) on the fit cells
  adam              Adam's first-order progress per tensor: a tensor of n scalars makes progress
                    sqrt(n) |G| / sqrt(1 + N / b) a step (its second moment holds the noise, its first moment's
                    noise averages out), so keeping k of the batch keeps sqrt((1 + N / B) / (1 + N / (k B))) of
                    it, weighted by its share of that progress
  adam-stage        the same with every tensor of a stage at the stage's kept share (what a planner, who knows
                    the plan's ratios and not the freezer's draws, computes: tfplan.cost.goodput's adam model)
  branch            a measured price: the run's own efficiency over its first evaluations, up to 30% of its steps
                    (what a paired branch of that many steps from the start, with and without the freezing on
                    the same data, would measure; it costs those steps once more per branch)

Fit and held out (issue 45): the fit cells are data seed 0 of scratch, crossing and finetune; everything else
(data seed 1, the `small` and `small-lr3e-4` regimes) is held out, and only the fitted model uses the fit cells.
The planner's model is chosen on the fit cells alone, by a rule fixed before any held-out cell ran (2026-12-06
03:45 UTC): among the models a planner can compute from a plan's stage ratios (mccandlish, momentum, adam-stage:
PLANNER_MODELS), the one whose worst regime has the smallest mean |residual|; the held-out cells then say how it
does. A cell passes when its prediction lies within its freeze seeds' scatter (max - min) or 0.05 of its median,
whichever is larger.

    python benchmarks/calibration_report.py --out runs/calib
    python benchmarks/calibration_report.py --out runs/calib --json runs/calib/report.json
"""

from __future__ import annotations

import argparse
import functools
import json
import math
import statistics
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "benchmarks"))

FIT = {("scratch", 0), ("crossing", 0), ("finetune", 0)}
BETA1 = 0.9
TOLERANCE = 0.05
PLANNER_MODELS = ("mccandlish", "momentum", "adam-stage")
"""The models tfplan implements (tfplan.cost.goodput Note [learning models]): stage ratios in, no realised draws."""
MODELS = ("free", "kept", "mccandlish", "mccandlish-tensor", "momentum", "momentum-tensor", "fit-tensor", "adam",
          "adam-stage", "branch")


def _json(path: Path) -> dict:
    return json.loads(path.read_text())


def _e(kept_tokens: float, noise: float) -> float:
    return 1.0 if noise <= 0 else kept_tokens / (kept_tokens + noise)


class Inputs:
    """What the models read of a regime's unfrozen run: per measured step, each stage's noise scale and |G|^2, and
    each tensor's end-of-run share of its stage's |G|^2 and noise scale relative to its stage's."""

    def __init__(self, none: Path) -> None:
        self.numel = {(t["stage"], t["name"]): t["numel"] for t in _json(none / "freeze_stats.json")["tensors"]}
        rows = [json.loads(line) for line in (none / "metrics.jsonl").read_text().splitlines()]
        self.trajectory = [(r["step"], r["noise_scale_tokens"], r["grad_sq"]) for r in rows
                           if "noise_scale_tokens" in r and None not in r["noise_scale_tokens"]
                           and None not in r["grad_sq"]]
        self.tensors: dict[tuple[int, str], tuple[float, float]] = {}
        """(stage, name) -> (its share of the stage's |G|^2, its noise scale over the stage's)."""
        for st in _json(none / "noise_tensors.json")["stages"]:
            for t in st["tensors"]:  # (a tensor whose |G|^2 estimate is not positive: no noise scale of its own)
                ratio = (t["noise_scale_tokens"] / st["noise_scale_tokens"] if t["noise_scale_tokens"] is not None
                         and st["noise_scale_tokens"] else 1.0)
                self.tensors[st["stage"], t["name"]] = (max(t["grad_sq"], 0.0) / st["grad_sq"], ratio)

    def at(self, step: int) -> tuple[list[float], list[float], list[float]]:
        """(noise scale per stage, |G|^2 share per stage, |G|^2 per stage) of the last measurement at or before
        `step`."""
        _, noise, gsq = next((r for r in reversed(self.trajectory) if r[0] <= step), self.trajectory[0])
        total = sum(gsq)
        return noise, [g / total for g in gsq], gsq


def _stage(kept: list[float], batch: float, noise: list[float], share: list[float], scale: float) -> float:
    """Instantaneous efficiency of a step whose stages kept `kept` of the batch (McCandlish per stage)."""
    base = sum(w * _e(batch, n * scale) for w, n in zip(share, noise))
    return sum(w * _e(k * batch, n * scale) for w, n, k in zip(share, noise, kept)) / base


def _tensor(kept: dict, batch: float, noise: list[float], share: list[float], x: Inputs, scale: float) -> float:
    """The same per tensor: weight = its stage's share x its share of the stage, noise = its stage's x its ratio."""
    base = got = 0.0
    for (s, name), (part, ratio) in x.tensors.items():
        w, n = share[s] * part, noise[s] * ratio * scale
        base += w * _e(batch, n)
        got += w * _e(kept.get((s, name), 1.0) * batch, n)
    return got / base


def _adam(kept: dict, batch: float, noise: list[float], gsq: list[float], x: Inputs) -> float:
    """Instantaneous efficiency under Adam's first-order progress (the `adam` model)."""
    base = got = 0.0
    for (s, name), (part, ratio) in x.tensors.items():
        n = noise[s] * ratio
        progress = math.sqrt(x.numel[s, name] * part * gsq[s]) / math.sqrt(1 + n / batch)
        k = kept.get((s, name), 1.0)
        base += progress
        got += progress * (math.sqrt((1 + n / batch) / (1 + n / (k * batch))) if k > 0 else 0.0)
    return got / base


@functools.cache
def tensor_kept(run: Path) -> list[dict[tuple[int, str], float]]:
    """Per step, each tensor's kept share of the step's micro-batches (frozen_sets.jsonl)."""
    lines = (run / "frozen_sets.jsonl").read_text().splitlines()
    names = json.loads(lines[0])["tensors"]
    out = []
    for line in lines[1:]:
        frozen = json.loads(line)["frozen"]
        out.append({(s, name): sum(i not in set(mb) for mb in per_mb) / len(per_mb)
                    for s, per_mb in enumerate(frozen) for i, name in enumerate(names[s])})
    return out


def instantaneous(run: Path, batch: float, x: Inputs, fitted: float | None) -> dict[str, list[float]]:
    """Every model's efficiency at each step of a run (module docstring)."""
    rows = [json.loads(line) for line in (run / "metrics.jsonl").read_text().splitlines()]
    rows = [r for r in rows if "event" not in r]
    kept_tensors = tensor_kept(run)
    momentum = (1 - BETA1) / (1 + BETA1)
    out: dict[str, list[float]] = {m: [] for m in MODELS if m != "branch"}
    for row, kept in zip(rows, kept_tensors):
        noise, share, gsq = x.at(row["step"])
        kept_stage = [1 - r for r in row["freeze_ratio"]]
        tensor_w = {k: share[k[0]] * x.tensors[k][0] for k in x.tensors}
        out["free"].append(1.0)
        out["kept"].append(sum(w * kept.get(k, 1.0) for k, w in tensor_w.items()) / sum(tensor_w.values()))
        out["mccandlish"].append(_stage(kept_stage, batch, noise, share, 1.0))
        out["mccandlish-tensor"].append(_tensor(kept, batch, noise, share, x, 1.0))
        out["momentum"].append(_stage(kept_stage, batch, noise, share, momentum))
        out["momentum-tensor"].append(_tensor(kept, batch, noise, share, x, momentum))
        out["fit-tensor"].append(_tensor(kept, batch, noise, share, x, fitted if fitted is not None else 1.0))
        out["adam"].append(_adam(kept, batch, noise, gsq, x))
        out["adam-stage"].append(_adam({k: kept_stage[k[0]] for k in x.tensors}, batch, noise, gsq, x))
    return out


def predictions(run: Path, batch: float, x: Inputs, fitted: float | None, evals: list[int]) -> dict[str, float]:
    """Every model's prediction for one run, like for like with the measurement (module docstring): the mean of
    its instantaneous efficiency over the steps before each of the run's second-half evaluations `evals` (steps
    completed), their median."""
    inst = instantaneous(run, batch, x, fitted)
    return {m: statistics.median(statistics.fmean(v[:s]) for s in evals) for m, v in inst.items()}


NULL_RATIO = 0.05
"""Cells at this ratio are controls (Note [trajectory floor]): they freeze too little to cost learning by any
model, but they perturb the trajectory."""


def _steps(run: Path) -> list[dict]:
    return [r for r in (json.loads(line) for line in (run / "metrics.jsonl").read_text().splitlines())
            if "event" not in r]


def is_null(cell: str) -> bool:
    return cell.startswith("s") and cell.endswith(f"-{NULL_RATIO}")


def ensemble(seed_dir: Path) -> list[dict]:
    """Note [trajectory floor]: the unfrozen curve as the pointwise median eval loss of the unfrozen run and the
    control runs (a 5% freeze on one stage, several freeze seeds), as metrics rows."""
    controls = [run for run in sorted(seed_dir.iterdir())
                if is_null(run.name.rsplit("-f", 1)[0]) and (run / "summary.json").exists()]
    curves = [_steps(seed_dir / "none")] + [_steps(run) for run in controls]
    by_step: dict[int, list[float]] = {}
    for steps in curves:
        for row in steps:
            if row.get("eval_loss") is not None:
                by_step.setdefault(row["step"], []).append(row["eval_loss"])
    return [{"step": s, "eval_loss": statistics.median(v)} for s, v in sorted(by_step.items())
            if len(v) == len(curves)]


def cells(out: Path) -> list[dict]:
    """One row per (regime, data seed, cell, freeze seed) that finished, with its measured efficiency against the
    unfrozen run and against the ensemble of the unfrozen run and the controls (Note [trajectory floor])."""
    from tfrun.records import efficiency

    rows = []
    for regime_dir in sorted(p for p in out.iterdir() if p.is_dir() and (p / "plans").is_dir()):
        for seed_dir in sorted(regime_dir.glob("seed*")):
            none = seed_dir / "none"
            if not (none / "summary.json").exists():
                continue
            base = _steps(none)
            floor = ensemble(seed_dir)
            config = _json(none / "run_config.json")
            batch = config["microbatch_size"] * config["num_microbatches"] * config["seq_len"] * config.get("dp", 1)
            x = Inputs(none)
            for run in sorted(seed_dir.iterdir()):
                if run.name == "none" or not (run / "summary.json").exists():
                    continue
                cell, freeze_seed = run.name.rsplit("-f", 1)
                steps = [json.loads(line) for line in (run / "metrics.jsonl").read_text().splitlines()]
                steps = [r for r in steps if "event" not in r]
                points = efficiency.pointwise(steps, base)
                measured = efficiency.summarise(points, len(steps))
                measured["evals"] = [s for s, e, _ in points if s > len(steps) / 2 and e is not None]
                early = [e for s, e, _ in points if s <= 0.3 * len(steps) and e is not None]
                measured["branch"] = statistics.median(early) if early else None
                against = efficiency.summarise(efficiency.pointwise(steps, floor), len(steps))
                measured["efficiency_raw"], measured["efficiency"] = measured["efficiency"], against["efficiency"]
                rows.append({"regime": regime_dir.name, "data_seed": int(seed_dir.name[4:]), "cell": cell,
                             "freeze_seed": int(freeze_seed), "run": run, "batch": batch, "inputs": x,
                             "ratios": _json(run / "summary.json")["realised_freeze_ratio"], **measured})
    return rows


def fit_scale(rows: list[dict]) -> float:
    """The noise factor of `fit-tensor`: least squares over the fit cells' runs, on a log grid (1e-3 .. 10)."""
    fit = [r for r in rows if (r["regime"], r["data_seed"]) in FIT and r["efficiency"] is not None]
    if not fit:
        return 1.0
    grid = [10 ** (k / 10) for k in range(-30, 11)]

    def loss(scale: float) -> float:
        return sum((predictions(r["run"], r["batch"], r["inputs"], scale, r["evals"])["fit-tensor"]
                    - r["efficiency"]) ** 2 for r in fit)

    return min(grid, key=loss)


def spearman(a: list[float], b: list[float]) -> float | None:
    """Rank correlation over three values or more; None where either side is constant (the `free` model)."""
    from noise_plot import spearman as rank

    rho = rank(a, b) if len(a) >= 3 else None
    return None if rho is None or math.isnan(rho) else rho


def report(out: Path) -> tuple[str, dict]:
    rows = cells(out)
    scale = fit_scale(rows)
    for r in rows:
        r["predicted"] = predictions(r["run"], r["batch"], r["inputs"], scale, r["evals"])
        r["predicted"]["branch"] = r["branch"] if r["branch"] is not None else 1.0
    groups: dict[tuple, list[dict]] = {}
    for r in rows:
        groups.setdefault((r["regime"], r["data_seed"], r["cell"]), []).append(r)
    lines = [f"learning efficiency, measured (median over freeze seeds [min .. max], eval-set error) and predicted; "
             f"fit-tensor's noise factor {scale:.3g} (fitted on {', '.join(f'{g} seed {s}' for g, s in sorted(FIT))})",
             f"{'regime':9s} {'seed':>4s} {'cell':9s} {'ratios':>11s} {'n':>2s} {'measured':>24s} {'eval se':>7s}  "
             + " ".join(f"{m[:10]:>10s}" for m in MODELS)]
    table = []
    for (regime, seed, cell), group in sorted(groups.items()):
        values = [r["efficiency"] for r in group if r["efficiency"] is not None]
        if not values:
            continue
        med = statistics.median(values)
        spread = max(values) - min(values) if len(values) > 1 else 0.0
        se = [r["efficiency_eval_se"] for r in group if r["efficiency_eval_se"] is not None]
        ratios = [statistics.fmean(r["ratios"][s] for r in group) for s in range(len(group[0]["ratios"]))]
        pred = {m: statistics.fmean(r["predicted"][m] for r in group) for m in MODELS}
        held = (regime, seed) not in FIT
        control = is_null(cell)
        plan = _json(out / regime / "plans" / f"{cell}.json")["predicted"]
        speedup = plan["no_freeze_ms"] / plan["planned_ms"]
        table.append({"regime": regime, "data_seed": seed, "cell": cell, "held_out": held, "control": control,
                      "ratios": ratios,
                      "speedup": speedup,
                      "efficiency": med, "values": values, "spread": spread,
                      "eval_se": statistics.median(se) if se else None, "predicted": pred})
        lines.append(f"{regime:9s} {seed:4d} {cell:9s} {' '.join(f'{x:.2f}' for x in ratios):>11s} {len(values):2d} "
                     f"{f'{med:.3f} [{min(values):.3f} .. {max(values):.3f}]':>24s} "
                     f"{'-' if not se else f'{statistics.median(se):.3f}':>7s}  "
                     + " ".join(f"{pred[m]:10.3f}" for m in MODELS)
                     + ("  (control)" if control else "  (held out)" if held else ""))
    lines.append("")
    lines.append("per model and regime (the controls, which make the baseline, left out): cells within max(seed "
                 "scatter, 0.05) of the measured median; mean |residual|; "
                 "Spearman with the measured efficiency; Spearman of goodput (efficiency x the plan's predicted "
                 "speedup, the same for both: the cells' speed was not measured) (fit cells / held-out cells)")
    summary = {}
    for model in MODELS:
        parts = []
        for regime in sorted({c["regime"] for c in table}):
            for held in (False, True):
                sel = [c for c in table if c["regime"] == regime and c["held_out"] == held and not c["control"]]
                if not sel:
                    continue
                ok = sum(abs(c["predicted"][model] - c["efficiency"]) <= max(c["spread"], TOLERANCE) for c in sel)
                res = statistics.fmean(abs(c["predicted"][model] - c["efficiency"]) for c in sel)
                rho = spearman([c["predicted"][model] for c in sel], [c["efficiency"] for c in sel])
                good = spearman([c["predicted"][model] * c["speedup"] for c in sel],
                                [c["efficiency"] * c["speedup"] for c in sel])
                key = f"{regime}{' held out' if held else ''}"
                summary.setdefault(model, {})[key] = {"within": ok, "cells": len(sel), "mean_abs_residual": res,
                                                      "spearman": rho, "goodput_spearman": good}
                parts.append(f"{key} {ok}/{len(sel)}, |r| {res:.3f}, rho {'-' if rho is None else f'{rho:+.2f}'}, "
                             f"goodput rho {'-' if good is None else f'{good:+.2f}'}")
        lines.append(f"  {model:18s} " + "; ".join(parts))
    fit_worst = {m: max(v["mean_abs_residual"] for k, v in summary[m].items() if "held out" not in k)
                 for m in PLANNER_MODELS if m in summary}
    chosen = min(fit_worst, key=fit_worst.get) if fit_worst else None
    if chosen is not None:
        lines.append(f"chosen for the planner (the smallest worst-regime mean |residual| on the fit cells, among "
                     f"{', '.join(PLANNER_MODELS)}): {chosen} ("
                     + ", ".join(f"{m} {v:.3f}" for m, v in fit_worst.items()) + ")")
    return "\n".join(lines), {"fit_scale": scale, "cells": table, "summary": summary, "chosen": chosen}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--out", required=True, help="benchmarks/calibration.py's --out")
    ap.add_argument("--json", default=None, help="also write the table as JSON here")
    args = ap.parse_args()
    text, data = report(Path(args.out))
    print(text)
    if args.json:
        Path(args.json).write_text(json.dumps(data, indent=1) + "\n")


if __name__ == "__main__":
    main()
