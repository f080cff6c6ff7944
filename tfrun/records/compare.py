"""`tfrun compare DIR...`: what each freezing method buys and costs, from the runs' own files.

Training time is wall time (tfrun.measure.wallclock Note [wall time]): every step's compute and everything between
steps (the online mode's solves and drift checks, the baselines' statistics, metrics, checkpoints), with
evaluation left out, as every run evaluates alike. Runs written before wall_ms existed count their step
times only, and say so (`wall_time` false).

One row per run: method; tokens/s over the whole run (its tokens over its training time) and the speedup that
gives against the baseline (the `--freeze none` run among them, or `--baseline DIR`); beside it, labelled,
the median per-step tokens/s and its ratio (the steady state, without the time between steps); the realised
mean freeze ratio (over stages and steps); final train and eval loss; the eval gap to the baseline; the time
to target: the training time until the run's eval loss first reaches the baseline's final eval loss, or
None; and the gap at equal time: the run's final eval loss against the baseline's eval loss after the same
training time (linear between the baseline's evaluations; None outside them), which is what a faster
method that ends at a higher loss must beat: the baseline stopped early. With `--paired` (tfrun.records.paired)
the same gap on the time axis `tfrun retime` measured side by side, which the machine's drift cannot move, labelled
apart from the raw one. Runs that are not comparable
(model, data, seed, batch shape) are refused unless forced.
Reads only files (metrics.jsonl, summary.json, run_config.json); no torch.
"""

from __future__ import annotations

import io
import json
import statistics
from dataclasses import dataclass
from pathlib import Path

from tfplan.fileio import write_bytes_atomic
from tfrun.errors import TfrunError
from tfrun.records import efficiency, paired

COMPARABLE = ("model", "model_hash", "data_path", "tokenizer_path", "seed", "microbatch_size", "seq_len",
              "num_microbatches", "init_from")


@dataclass(frozen=True, kw_only=True, slots=True)
class Run:
    """One run directory, read."""

    dir: str
    config: dict
    summary: dict
    steps: list[dict]
    """metrics.jsonl's per-step records (events left out)."""

    @property
    def method(self) -> str:
        """A short name: the freeze mode, its cap and the options that change what it does."""
        c = self.config
        freeze = c.get("freeze", "plan")
        name = freeze
        if freeze in ("plan", "timely", "uniform", "timely+apf", "timely+autofreeze"):
            caps = _caps(self)
            if caps:
                name += f" cap {caps}"
        if c.get("grad_rescale"):
            name += " +rescale"
        if c.get("freeze_policy", "auto") != "auto" and freeze not in ("none", "apf", "autofreeze"):
            name += f" ({c['freeze_policy']})"
        return name

    @property
    def wall_time(self) -> bool:
        """Whether every step carries its wall time (else training time is the sum of step times)."""
        return all("wall_ms" in row for row in self.steps)

    @property
    def training_s(self) -> float:
        """Training time: the sum of the steps' wall times (module docstring)."""
        return sum(_seconds(row) for row in self.steps)

    @property
    def tokens(self) -> int:
        """Tokens trained on (every step)."""
        per_step = _step_tokens(self.config)
        return sum(row.get("tokens", per_step) for row in self.steps)

    @property
    def eval_points(self) -> list[tuple[int, float, float]]:
        """(step, training seconds so far, eval loss) at every evaluation."""
        out, seconds = [], 0.0
        for row in self.steps:
            seconds += _seconds(row)
            if row.get("eval_loss") is not None:
                out.append((row["step"], seconds, row["eval_loss"]))
        return out

    @property
    def mean_freeze_ratio(self) -> float:
        """Realised mean over stages and steps."""
        values = [statistics.fmean(row["freeze_ratio"]) for row in self.steps if row.get("freeze_ratio")]
        return statistics.fmean(values) if values else 0.0


def _seconds(row: dict) -> float:
    """A step's training time (s): its wall time, or its step time in runs written before wall_ms existed."""
    return row.get("wall_ms", row["step_time_ms"]) / 1e3


def _step_tokens(config: dict) -> int:
    """Tokens per step from a run's config (rows written before `tokens` existed)."""
    return (config.get("dp", 1) * config.get("microbatch_size", 0) * config.get("num_microbatches", 0)
            * config.get("seq_len", 0))


def _caps(run: Run) -> str:
    """The run's caps, comma-separated, and " goodput" when its plan was solved for goodput."""
    c = run.config
    goodput = ""
    if c.get("freeze") == "timely":
        caps = c.get("max_freeze_ratio") or []
        goodput = " goodput" if c.get("objective") == "goodput" else ""
    else:
        path = c.get("plan_path")
        try:
            obj = json.loads(Path(path).read_text()) if path else {}
            caps = obj.get("max_freeze_ratio", [])
            goodput = " goodput" if (obj.get("goodput") or {}).get("objective") == "goodput" else ""
        except (OSError, ValueError, TypeError, AttributeError):
            caps = []
    caps = sorted(set(caps))
    return ",".join(f"{x:g}" for x in caps) + goodput


def load_run(path: str | Path) -> Run:
    """Read a run directory; one clear line if it is not a finished tfrun run."""
    from tfplan.errors import TfplanError
    from tfplan.report import summary as summary_mod

    folder = Path(path)
    try:
        config = json.loads((folder / "run_config.json").read_text())
        summary = summary_mod.load(folder / "summary.json", required=("tokens_per_s", "final_train_loss"))
        rows = [json.loads(line) for line in (folder / "metrics.jsonl").read_text().splitlines() if line.strip()]
    except FileNotFoundError as exc:
        raise TfrunError(f"{folder}: not a finished tfrun run ({Path(exc.filename).name} missing)") from None
    except TfplanError as exc:
        if "not found" in str(exc):
            raise TfrunError(f"{folder}: not a finished tfrun run (summary.json missing)") from None
        raise TfrunError(str(exc)) from None
    except (OSError, ValueError) as exc:
        raise TfrunError(f"{folder}: unreadable run files ({exc})") from None
    if not isinstance(config, dict) or not all(isinstance(r, dict) for r in rows):
        raise TfrunError(f"{folder}: unreadable run files (run_config.json and each line of metrics.jsonl must be "
                         "JSON objects)")
    steps = [r for r in rows if "event" not in r]
    if not steps:
        raise TfrunError(f"{folder}: metrics.jsonl has no steps")
    return Run(dir=str(folder), config=config, summary=summary, steps=steps)


def check_comparable(runs: list[Run]) -> None:
    """Raises TfrunError naming the first setting that differs between runs."""
    first = runs[0]
    for run in runs[1:]:
        for key in COMPARABLE:
            if run.config.get(key) != first.config.get(key):
                raise TfrunError(f"runs are not comparable: {key} is {first.config.get(key)!r} in {first.dir} but "
                                 f"{run.config.get(key)!r} in {run.dir} (--force compares anyway)")


def load_comparable(paths: list[str], baseline: str | None, force: bool, command: str) -> tuple[list[Run], Run]:
    """The runs of `tfrun compare` or `tfrun retime` read, checked comparable (unless forced), and their baseline;
    one TfrunError line for fewer than two."""
    if len(paths) < 2:
        raise TfrunError(f"{command} needs two or more run folders")
    loaded = [load_run(path) for path in paths]
    if not force:
        check_comparable(loaded)
    return loaded, pick_baseline(loaded, baseline, force)


def pick_baseline(runs: list[Run], baseline: str | None, force: bool = False) -> Run:
    """The baseline run: `baseline` (checked against the runs unless forced) or the --freeze none one."""
    if baseline is not None:
        base = next((r for r in runs if Path(r.dir).resolve() == Path(baseline).resolve()), None)
        if base is None:
            base = load_run(baseline)
            if not force:
                check_comparable([base, *runs])
        return base
    nones = [r for r in runs if r.config.get("freeze") == "none"]
    if len(nones) != 1:
        raise TfrunError(f"{'no' if not nones else 'several'} --freeze none runs among them: name the baseline "
                         "with --baseline DIR")
    return nones[0]


def loss_at(points: list[tuple[int, float, float]], seconds: float) -> float | None:
    """Eval loss after `seconds` of training, linear between evaluations; None before the first or after the
    last (no extrapolation)."""
    for (_, t0, l0), (_, t1, l1) in zip(points, points[1:]):
        if t0 <= seconds <= t1:
            return l0 if t1 == t0 else l0 + (l1 - l0) * (seconds - t0) / (t1 - t0)
    if points and abs(points[-1][1] - seconds) <= 1e-9 * max(1.0, seconds):
        return points[-1][2]
    return None


def compare(runs: list[Run], base: Run, retime: dict | None = None) -> dict:
    """The comparison as JSON: {"baseline": DIR, "runs": [...]} (module docstring); with `retime` (a `tfrun retime`
    output, tfrun.records.paired) also the gap at equal paired time."""
    base_timing = paired.timing_of(retime, base.dir) if retime is not None else None
    if retime is not None and base_timing is None:
        raise TfrunError(f"the baseline {base.dir} was not re-timed in the --paired file: retime it with the others")
    base_axis = paired.paired_axis(base.steps, base_timing, retime["sample_every"]) if base_timing else None
    target = base.summary.get("final_eval_loss")
    base_points = base.eval_points  # a property that walks every step: once, not once per run
    base_speed = base.tokens / base.training_s
    rows = []
    for run in runs:
        s = run.summary
        points = run.eval_points
        reached = next((sec for _, sec, loss in points if target is not None and loss <= target), None)
        last = points[-1] if points else None
        base_then = loss_at(base_points, last[1]) if last else None
        training_s = run.training_s
        rows.append({
            "dir": run.dir, "method": run.method, "wall_time": run.wall_time, "training_s": training_s,
            "tokens": run.tokens, "tokens_per_s": run.tokens / training_s,
            "speedup": run.tokens / training_s / base_speed,
            "step_tokens_per_s": s["tokens_per_s"], "step_speedup": s["tokens_per_s"] / base.summary["tokens_per_s"],
            "mean_freeze_ratio": run.mean_freeze_ratio,
            "freeze_ratio_per_stage": s.get("realised_freeze_ratio"),
            "final_train_loss": s["final_train_loss"], "final_eval_loss": s.get("final_eval_loss"),
            "eval_gap": (s["final_eval_loss"] - target) / target if target and s.get("final_eval_loss") else None,
            "time_to_target_s": reached,
            "baseline_eval_at_same_time": base_then,
            "eval_gap_same_time": (last[2] - base_then) / base_then if base_then else None,
        })
        rows[-1] |= _efficiency_fields(run, base)
        if base_axis is not None:
            rows[-1] |= paired.paired_fields(run.steps, paired.timing_of(retime, run.dir), base_axis, run.tokens,
                                             base.tokens, loss_at, retime["sample_every"])
    efficiency.seed_spread(rows, [efficiency.cell_key(run.config) for run in runs])
    return {"baseline": base.dir, "target_eval_loss": target, "runs": rows}


def _efficiency_fields(run: Run, base: Run) -> dict:
    """The run's learning efficiency from the loss curves against the baseline's (tfrun.records.efficiency Note
    [efficiency from curves]; 1 for the baseline itself), its curve, its eval-set error, and the learning model's
    prediction from the run's own measured noise and realised ratios (predicted_efficiency)."""
    if run is base:
        return {"efficiency": 1.0, "efficiency_eval_se": None, "efficiency_points": None, "efficiency_curve": [],
                "efficiency_predicted": 1.0}
    points = efficiency.pointwise(run.steps, base.steps)
    return {**efficiency.summarise(points, len(run.steps)),
            "efficiency_curve": [[steps, e] for steps, e, _ in points],
            "efficiency_predicted": predicted_efficiency(run, base)}


def predicted_efficiency(run: Run, base: Run) -> float | None:
    """The learning model's efficiency for a run (tfplan.cost.goodput's default, Note [learning models]): its
    realised mean ratio per stage at its own measured noise scale and shares (the baseline's where the run
    measured none); None without either."""
    from tfplan.cost.goodput import measured, progress

    ratios = run.summary.get("realised_freeze_ratio")
    source = next((r.summary for r in (run, base) if _has_noise(r.summary)), None)
    if not ratios or source is None:
        return None
    noise = measured(source["noise_scale_tokens"], source["grad_sq_share"], 1, source.get("update_share"),
                     adam_beta1=(run.config.get("adam_betas") or [0.9])[0])
    batch = _step_tokens(run.config)
    unfrozen = progress([0.0] * len(ratios), batch, noise)
    return progress(ratios, batch, noise) / unfrozen if unfrozen > 0 else None


def _has_noise(summary: dict) -> bool:
    scales, shares = summary.get("noise_scale_tokens"), summary.get("grad_sq_share")
    return bool(scales) and bool(shares) and None not in scales and None not in shares


def plot(runs: list[Run], path: str | Path, result: dict | None = None) -> None:
    """Eval loss against step and against training time, tokens/s per step, realised ratio per stage; with the
    comparison's `result`, also each run's learning efficiency by step and measured against predicted."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, axes = plt.subplots(2, 3 if result else 2, figsize=(19 if result else 13, 9))
    colors = plt.get_cmap("tab10" if len(runs) <= 10 else "tab20").colors  # one colour per run
    for run, color in zip(runs, colors * (len(runs) // len(colors) + 1)):
        pts = run.eval_points
        label = f"{run.method} ({Path(run.dir).name})"
        line = axes[0][0].plot([p[0] for p in pts], [p[2] for p in pts], marker=".", label=label, color=color)[0]
        axes[0][1].plot([p[1] for p in pts], [p[2] for p in pts], marker=".", color=line.get_color())
        speed = [r["tokens_per_s"] for r in run.steps]  # per-step times are noisy: a running median of 15
        smooth = [statistics.median(speed[max(0, i - 7):i + 8]) for i in range(len(speed))]
        axes[1][0].plot([r["step"] for r in run.steps], smooth, color=line.get_color(), alpha=0.8)
        stages = len(run.steps[0].get("freeze_ratio") or [])
        for s, style in zip(range(stages), ("-", "--", ":", "-.") * 8):
            axes[1][1].plot([r["step"] for r in run.steps], [r["freeze_ratio"][s] for r in run.steps],
                            linestyle=style, color=line.get_color())
    titles = (("eval loss by step", "step", "eval loss"), ("eval loss by training time", "seconds", "eval loss"),
              ("tokens/s per step (running median of 15 steps)", "step", "tokens/s"),
              ("realised freeze ratio per stage (stage 0 solid, 1 dashed, 2 dotted, ...)", "step", "ratio"))
    for ax, (title, x, y) in zip((a for row in axes for a in row), titles):
        ax.set_title(title, fontsize=10)
        ax.set_xlabel(x)
        ax.set_ylabel(y)
        ax.grid(alpha=0.3)
    axes[0][0].legend(fontsize=8)
    if result:
        _plot_efficiency(axes[0][2], axes[1][2], result, colors)
    fig.tight_layout()
    buf = io.BytesIO()
    fig.savefig(buf, format="png", dpi=110)
    plt.close(fig)
    write_bytes_atomic(path, buf.getvalue())


def _plot_efficiency(by_step, against, result: dict, colors) -> None:
    """Efficiency by step per run (Note [efficiency from curves]); measured (median over the second half, with the
    freeze seeds' range) against the learning model's prediction."""
    for row, color in zip(result["runs"], colors * (len(result["runs"]) // len(colors) + 1)):
        points = [(s, e) for s, e in row["efficiency_curve"] if e is not None]
        if points:
            by_step.plot([p[0] for p in points], [p[1] for p in points], marker=".", color=color)
        if row["efficiency"] is not None and row["efficiency_predicted"] is not None:
            against.scatter([row["efficiency_predicted"]], [row["efficiency"]], color=color)
    against.plot([0, 1], [0, 1], color="grey", linewidth=0.8)
    for ax, (title, x, y) in zip((by_step, against), (
            ("learning efficiency by step (unfrozen steps to the same eval loss / steps)", "step", "efficiency"),
            ("efficiency: measured (second-half median) against predicted", "predicted", "measured"))):
        ax.set_title(title, fontsize=10)
        ax.set_xlabel(x)
        ax.set_ylabel(y)
        ax.grid(alpha=0.3)
