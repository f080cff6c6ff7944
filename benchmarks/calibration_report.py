"""The learning price of freezing, measured (benchmarks/calibration.py's runs) against the learning models' predictions.

For every cell of every regime and data seed: the measured efficiency (tfrun.records.efficiency: unfrozen steps
to the cell's eval loss over its steps, median over the second half) per freeze seed, their median and spread,
the eval set's own error, and each learning model's prediction from measured inputs: the unfrozen run's noise
scales and |G|^2 shares (per stage from summary.json, per tensor from noise_tensors.json: what a planner knows
before freezing) and the cell's realised freezing (per stage from summary.json, per tensor from
freeze_stats.json's contributions: which micro-batches each tensor learnt from).

The models (docs/cost-model.md says which one the planner uses, and why):
  free              freezing costs no learning: e = 1
  kept              every frozen sample is lost: e = the |G|^2-weighted kept share (N -> infinity)
  mccandlish        McCandlish's b / (b + N) per stage at the stage's kept batch, |G|^2 shares (the third study's)
  mccandlish-tensor the same per tensor, at each tensor's realised kept batch
  momentum          mccandlish with Adam's first moment averaging (1 + b1) / (1 - b1) steps of gradient noise
                    (N / 19 at b1 = 0.9)
  momentum-tensor   the same per tensor
  fit-tensor        mccandlish-tensor with N scaled by one factor fitted (least squares) on the fit cells

Fit and held out (issue 45): the fit cells are data seed 0 of scratch, crossing and finetune; everything else
(data seed 1, the `small` regime) is held out, and only the fitted model uses the fit cells. A cell passes
when its prediction lies within its freeze seeds' scatter (max - min) or 0.05 of its median, whichever is larger.

    python benchmarks/calibration_report.py --out runs/calib
    python benchmarks/calibration_report.py --out runs/calib --json runs/calib/report.json
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "benchmarks"))

FIT = {("scratch", 0), ("crossing", 0), ("finetune", 0)}
BETA1 = 0.9
TOLERANCE = 0.05
MODELS = ("free", "kept", "mccandlish", "mccandlish-tensor", "momentum", "momentum-tensor", "fit-tensor")


def _json(path: Path) -> dict:
    return json.loads(path.read_text())


def _e(kept_tokens: float, noise: float) -> float:
    return 1.0 if noise <= 0 else kept_tokens / (kept_tokens + noise)


class Inputs:
    """What the models read of a regime's unfrozen run: per stage and per tensor noise scales and |G|^2 shares."""

    def __init__(self, none: Path) -> None:
        summary = _json(none / "summary.json")
        self.stage_noise = summary["noise_scale_tokens"]
        self.stage_share = summary["grad_sq_share"]
        tensors = _json(none / "noise_tensors.json")["stages"]
        total = sum(t["grad_sq"] for st in tensors for t in st["tensors"])
        self.tensor = {(st["stage"], t["name"]): (t["noise_scale_tokens"], t["grad_sq"] / total)
                       for st in tensors for t in st["tensors"]}


def _stage_model(ratios: list[float], batch: float, x: Inputs, scale: float) -> float:
    base = sum(w * _e(batch, n * scale) for w, n in zip(x.stage_share, x.stage_noise))
    return sum(w * _e((1 - r) * batch, n * scale) for w, n, r in zip(x.stage_share, x.stage_noise, ratios)) / base


def _tensor_model(kept: dict, batch: float, x: Inputs, scale: float) -> float:
    base = got = 0.0
    for key, (n, w) in x.tensor.items():
        base += w * _e(batch, n * scale)
        got += w * _e(kept.get(key, 1.0) * batch, n * scale)
    return got / base


def predictions(run: Path, batch: float, x: Inputs, fitted: float | None) -> dict[str, float]:
    """Every model's efficiency for one run."""
    ratios = _json(run / "summary.json")["realised_freeze_ratio"]
    stats = _json(run / "freeze_stats.json")
    m = stats["num_microbatches"]
    kept = {(t["stage"], t["name"]): t["contributions"] / (t["steps"] * m) for t in stats["tensors"]}
    momentum = (1 - BETA1) / (1 + BETA1)
    out = {"free": 1.0,
           "kept": sum(w * kept.get(k, 1.0) for k, (_, w) in x.tensor.items()),
           "mccandlish": _stage_model(ratios, batch, x, 1.0),
           "mccandlish-tensor": _tensor_model(kept, batch, x, 1.0),
           "momentum": _stage_model(ratios, batch, x, momentum),
           "momentum-tensor": _tensor_model(kept, batch, x, momentum)}
    if fitted is not None:
        out["fit-tensor"] = _tensor_model(kept, batch, x, fitted)
    return out


def cells(out: Path) -> list[dict]:
    """One row per (regime, data seed, cell, freeze seed) that finished, with its measured efficiency."""
    from tfrun.records import efficiency

    rows = []
    for regime_dir in sorted(p for p in out.iterdir() if p.is_dir() and (p / "plans").is_dir()):
        for seed_dir in sorted(regime_dir.glob("seed*")):
            none = seed_dir / "none"
            if not (none / "summary.json").exists():
                continue
            base = [json.loads(line) for line in (none / "metrics.jsonl").read_text().splitlines()]
            base = [r for r in base if "event" not in r]
            config = _json(none / "run_config.json")
            batch = config["microbatch_size"] * config["num_microbatches"] * config["seq_len"] * config.get("dp", 1)
            x = Inputs(none)
            for run in sorted(seed_dir.iterdir()):
                if run.name == "none" or not (run / "summary.json").exists():
                    continue
                cell, freeze_seed = run.name.rsplit("-f", 1)
                steps = [json.loads(line) for line in (run / "metrics.jsonl").read_text().splitlines()]
                steps = [r for r in steps if "event" not in r]
                measured = efficiency.summarise(efficiency.pointwise(steps, base), len(steps))
                rows.append({"regime": regime_dir.name, "data_seed": int(seed_dir.name[4:]), "cell": cell,
                             "freeze_seed": int(freeze_seed), "run": run, "batch": batch, "inputs": x,
                             "ratios": _json(run / "summary.json")["realised_freeze_ratio"], **measured})
    return rows


def fit_scale(rows: list[dict]) -> float:
    """The noise factor of `fit-tensor`: least squares over the fit cells' runs, on a log grid (1e-3 .. 10)."""
    fit = [r for r in rows if (r["regime"], r["data_seed"]) in FIT and r["efficiency"] is not None]
    if not fit:
        return 1.0
    grid = [10 ** (k / 20) for k in range(-60, 21)]

    def loss(scale: float) -> float:
        return sum((predictions(r["run"], r["batch"], r["inputs"], scale)["fit-tensor"] - r["efficiency"]) ** 2
                   for r in fit)

    return min(grid, key=loss)


def spearman(a: list[float], b: list[float]) -> float | None:
    from noise_plot import spearman as rank

    return rank(a, b) if len(a) >= 3 else None


def report(out: Path) -> tuple[str, dict]:
    rows = cells(out)
    scale = fit_scale(rows)
    for r in rows:
        r["predicted"] = predictions(r["run"], r["batch"], r["inputs"], scale)
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
        table.append({"regime": regime, "data_seed": seed, "cell": cell, "held_out": held, "ratios": ratios,
                      "efficiency": med, "values": values, "spread": spread,
                      "eval_se": statistics.median(se) if se else None, "predicted": pred})
        lines.append(f"{regime:9s} {seed:4d} {cell:9s} {' '.join(f'{x:.2f}' for x in ratios):>11s} {len(values):2d} "
                     f"{f'{med:.3f} [{min(values):.3f} .. {max(values):.3f}]':>24s} "
                     f"{'-' if not se else f'{statistics.median(se):.3f}':>7s}  "
                     + " ".join(f"{pred[m]:10.3f}" for m in MODELS) + ("  (held out)" if held else ""))
    lines.append("")
    lines.append("per model and regime: cells within max(seed scatter, 0.05) of the measured median; mean |residual|; "
                 "Spearman with the measured efficiency (fit cells / held-out cells)")
    summary = {}
    for model in MODELS:
        parts = []
        for regime in sorted({c["regime"] for c in table}):
            for held in (False, True):
                sel = [c for c in table if c["regime"] == regime and c["held_out"] == held]
                if not sel:
                    continue
                ok = sum(abs(c["predicted"][model] - c["efficiency"]) <= max(c["spread"], TOLERANCE) for c in sel)
                res = statistics.fmean(abs(c["predicted"][model] - c["efficiency"]) for c in sel)
                rho = spearman([c["predicted"][model] for c in sel], [c["efficiency"] for c in sel])
                key = f"{regime}{' held out' if held else ''}"
                summary.setdefault(model, {})[key] = {"within": ok, "cells": len(sel), "mean_abs_residual": res,
                                                      "spearman": rho}
                parts.append(f"{key} {ok}/{len(sel)}, |r| {res:.3f}, rho {'-' if rho is None else f'{rho:+.2f}'}")
        lines.append(f"  {model:18s} " + "; ".join(parts))
    return "\n".join(lines), {"fit_scale": scale, "cells": table, "summary": summary}


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
