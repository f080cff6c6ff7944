"""`tfrun`: run pipeline-parallel training that applies a TimelyFreeze plan, and measure profiles.

Examples:
    tfrun train --plan plan.json --steps 30 --out runs/plan
    tfrun train --plan plan.json --freeze none --out runs/baseline
    tfrun profile --model tiny --stages 2 --microbatches 8 --output profile.json
    tfrun export runs/plan --hf runs/plan-hf
"""

from __future__ import annotations

import gc
import json
import math
import statistics
import sys
from pathlib import Path
from typing import Annotated

import typer
from rich.console import Console

from tfplan.cli.options import user_errors
from tfrun.cli.train_cmd import train_cmd
from tfrun.errors import TfrunError

app = typer.Typer(
    name="tfrun",
    help="Run pipeline-parallel training with per-micro-batch freezing (torch.distributed.pipelining).",
    no_args_is_help=True,
    add_completion=False,
    pretty_exceptions_enable=False,
)


app.command("train")(train_cmd)


@app.command("compare")
def compare_cmd(
    runs: Annotated[list[str], typer.Argument(help="Run folders of `tfrun train` (two or more).")],
    baseline: Annotated[
        str | None, typer.Option("--baseline", help="The reference run (default: the --freeze none one).")
    ] = None,
    per_stage: Annotated[bool, typer.Option("--per-stage", help="Show the realised ratio of each stage.")] = False,
    plot: Annotated[str | None, typer.Option("--plot", help="Write the curves to this PNG (matplotlib).")] = None,
    force: Annotated[bool, typer.Option("--force", help="Compare runs of another model, data, seed or batch.")] = False,
    as_json: Annotated[bool, typer.Option("--json", help="One JSON object on stdout.")] = False,
    paired_file: Annotated[
        list[str] | None, typer.Option("--paired", help="A `tfrun retime` output (OUT/retime.json): add the gap at "
                                                        "equal time on its side-by-side time axis, which drift "
                                                        "cannot move. Repeat it for several launches of retime: "
                                                        "the median over launches.")
    ] = None,
) -> None:
    """What each method buys and costs: training time (wall time, evaluation excluded), tokens/s over it and
    the speedup against the unfrozen run (and, labelled, the median step's), realised freeze ratio, final
    train and eval loss, eval gap (also against the unfrozen run after the same training time) and the
    training time to reach the unfrozen run's final eval loss.

    Example: tfrun compare runs/baseline runs/plan runs/apf --plot compare.png
    """
    from rich.table import Table

    from tfrun.records import compare, paired

    with user_errors(TfrunError):
        loaded, base = compare.load_comparable(runs, baseline, force, "compare")
        result = compare.compare(loaded, base, paired.load_all(paired_file) if paired_file else None)
        if plot:
            compare.plot(loaded, plot, result)
        if as_json:
            print(json.dumps(result))
            return
        table = Table(title=f"against {base.dir} (target eval loss {result['target_eval_loss']:.4f}; training time "
                            "is wall time, evaluation excluded)", title_justify="left", show_edge=False)
        for col in ("run", "method", "training time", "tokens/s", "speedup", "median step speedup", "freeze ratio",
                    "train loss", "eval loss", "eval gap", "gap at equal time", *(
                        ("paired gap (spread)",) if paired_file else ()), "time to target", "efficiency",
                    "predicted"):
            table.add_column(col, justify="left" if col in ("run", "method") else "right")
        for row in result["runs"]:
            ratio = (" ".join(f"{r:.2f}" for r in row["freeze_ratio_per_stage"] or []) if per_stage
                     else f"{row['mean_freeze_ratio']:.3f}")
            reached = row["time_to_target_s"]
            table.add_row(Path(row["dir"]).name, row["method"],
                          f"{row['training_s']:.1f} s" + ("" if row["wall_time"] else " (steps only)"),
                          f"{row['tokens_per_s']:.0f}", f"{row['speedup']:.3f}", f"{row['step_speedup']:.3f}", ratio,
                          f"{row['final_train_loss']:.4f}",
                          f"{row['final_eval_loss']:.4f}" if row["final_eval_loss"] is not None else "-",
                          f"{row['eval_gap']:+.2%}" if row["eval_gap"] is not None else "-",
                          f"{row['eval_gap_same_time']:+.2%}" if row["eval_gap_same_time"] is not None else "-",
                          *((_paired_cell(row),) if paired_file else ()),
                          f"{reached:.0f} s" if reached is not None else "not reached", _efficiency_cell(row),
                          "-" if row["efficiency_predicted"] is None else f"{row['efficiency_predicted']:.3f}")
        # off a terminal rich assumes 80 columns and wraps every cell; a file gets the table whole
        console = Console(highlight=False, width=None if sys.stdout.isatty() else 200)
        console.print(table)
        once = [Path(run.dir).name for run in loaded if sum("eval_loss" in row for row in run.steps) < 2]
        if once:  # their '-' under the gap at equal time and the efficiency would say nothing of why
            console.print(f"{', '.join(once)}: evaluated once, at the end, so no loss curve to read the gap at equal "
                          "time or the efficiency from; train with --eval-every K to have one")
        if plot:
            console.print(f"plot written to {plot}")


def _efficiency_cell(row: dict) -> str:
    """The run's efficiency, and its freeze seeds' range where its cell ran several."""
    if row["efficiency"] is None:
        return "-"
    spread = row.get("efficiency_seed_spread")
    return f"{row['efficiency']:.3f}" + ("" if spread is None else f" ({spread:.3f} over {row['efficiency_seeds']})")


def _paired_cell(row: dict) -> str:
    gap = row.get("eval_gap_same_time_paired")
    return "-" if gap is None else f"{gap:+.2%} ({row['eval_gap_same_time_paired_spread'] * 100:.2f} pp)"


@app.command("retime")
def retime_cmd(
    runs: Annotated[list[str], typer.Argument(help="Run folders of `tfrun train` (two or more), the baseline among "
                                                   "them.")],
    baseline: Annotated[
        str | None, typer.Option("--baseline", help="The reference run (default: the --freeze none one).")
    ] = None,
    out: Annotated[str, typer.Option("--out", help="Output folder: retime.json and the ranks' logs.")] = "runs/retime",
    sample_every: Annotated[int, typer.Option("--sample-every", min=1, help="Replay every K-th step of each run.")
                            ] = 10,
    block: Annotated[int, typer.Option("--block", min=1, help="Sampled steps a run replays before the next run's "
                                                             "turn.")] = 3,
    repeats: Annotated[int, typer.Option("--repeats", min=1, help="Times the whole replay runs (its spread is the "
                                                                  "instrument's).")] = 3,
    force: Annotated[bool, typer.Option("--force", help="Replay runs of another seed or data (model and batch shape "
                                                        "must match).")] = False,
) -> None:
    """Time recorded runs again side by side (the note on paired time in tfrun/retime.py): every run's recorded
    frozen sets, replayed in alternating blocks on one launch of ranks, so that the machine's drift lands on all
    of them alike. Then `tfrun compare RUN... --paired OUT/retime.json` gives the gap at equal time on that time
    axis.

    Example: tfrun retime runs/baseline runs/plan --out runs/retime && tfrun compare runs/baseline runs/plan --paired
    runs/retime/retime.json
    """
    from tfrun import retime

    with user_errors(TfrunError):
        result = retime.retime(runs, baseline=baseline, out=out, sample_every=sample_every, block=block,
                                repeats=repeats, force=force)
        for run in result["runs"]:
            medians = [statistics.median(ms) for ms in run["step_ms"]]
            print(f"{run['dir']}: {len(run['steps'][0])} steps replayed a repeat, median step "
                  + ", ".join(f"{m:.1f}" for m in medians) + " ms (per repeat)")
        print(f"every replayed action froze what its run recorded: {result['mismatched_actions'] == 0}")
        print(f"wrote {Path(out) / 'retime.json'} ({result['seconds']:.0f} s); "
              f"next: tfrun compare {' '.join(runs)} --paired {Path(out) / 'retime.json'}")


@app.command("profile")
def profile_cmd(
    model: Annotated[str, typer.Option("--model", help="Model size (tfrun.models.MODELS) or hf:DIR.")] = "tiny",
    stages: Annotated[
        int, typer.Option("--stages", help="Pipeline stages in the paper's sense, one per rank; the profile holds "
                                             "stages x stages-per-rank model chunks.")
    ] = 2,
    microbatches: Annotated[int, typer.Option("--microbatches", "-m", help="Micro-batches per step.")] = 8,
    schedule: Annotated[
        str, typer.Option("--schedule", help="Schedule to profile (any tfrun runs); the other backward style "
                                             "comes from its counterpart.")
    ] = "1f1b",
    stages_per_rank: Annotated[
        int | None, typer.Option("--stages-per-rank", help="Stages per rank V (default: the schedule's).")
    ] = None,
    steps: Annotated[int, typer.Option("--steps", help="Steps per measuring run (4 runs; 2 untimed).")] = 20,
    repeat: Annotated[
        int, typer.Option("--repeat", help="Measure N times and keep the most consistent set.")
    ] = 1,
    dp: Annotated[
        int, typer.Option("--dp", help="Measure with this many data-parallel replicas (their gradient reduction "
                                       "in the tails).")
    ] = 1,
    microbatch_size: Annotated[int, typer.Option("--microbatch-size", help="Sequences per micro-batch.")] = 4,
    seq_len: Annotated[int, typer.Option("--seq-len", help="Tokens per sequence.")] = 128,
    threads: Annotated[int, typer.Option("--threads", help="Compute threads per rank (CPU).")] = 1,
    seed: Annotated[int, typer.Option("--seed", help="Seed.")] = 0,
    output: Annotated[str, typer.Option("--output", "-o", help="Profile JSON to write.")] = "profile.json",
    precision: Annotated[
        str, typer.Option("--precision", help="auto (bf16 on CUDA, fp32 on CPU), fp32 or bf16, as tfrun train.")
    ] = "auto",
    work_dir: Annotated[
        str | None, typer.Option("--work-dir", help="Keep the measuring runs here (default: a temp folder).")
    ] = None,
    init_from: Annotated[
        str | None, typer.Option("--init-from", help="Measure from this run's latest weights (the noise scale "
                                                     "depends on them: a fine-tuning job's checkpoint).")
    ] = None,
    data: Annotated[
        str | None, typer.Option("--data", help="Training text file, or 'stdlib' (as tfrun train).")
    ] = None,
) -> None:
    """Measure a profile inside the pipeline: nothing frozen, then everything frozen, with the schedule itself
    and its counterpart of the other backward style (tfrun.cli.profiling); writes tfplan's format and warns when
    a measurement is unstable. The unfrozen run also measures each stage's gradient noise scale (the profile's
    noise section, for `tfplan solve --objective goodput`), at --init-from's weights if given."""
    from tfrun.cli import profiling

    with user_errors(TfrunError):
        prof = profiling.measure(
            model=model, num_ranks=stages, num_microbatches=microbatches, schedule=schedule,
            stages_per_rank=stages_per_rank, steps=steps, microbatch_size=microbatch_size, seq_len=seq_len,
            threads=threads, seed=seed, work_dir=work_dir, repeat=repeat, dp=dp, init_from=init_from, data_path=data,
            precision=precision,
        )
        from tfplan.fileio import write_json_atomic

        write_json_atomic(output, prof.to_dict())
        warnings = (prof.quality or {}).get("warnings", [])
        console = Console(highlight=False, stderr=True)
        for warning in warnings[:5]:
            console.print(f"[yellow]warning:[/yellow] {warning}")
        if len(warnings) > 5:
            console.print(f"[yellow]warning:[/yellow] and {len(warnings) - 5} more (quality.warnings in {output})")
        Console(highlight=False).print(f"profile written to {output}")


@app.command("export")
def export_cmd(
    run_dir: Annotated[str, typer.Argument(help="A `tfrun train` output folder.")],
    hf_out: Annotated[str, typer.Option("--hf", help="Write a Hugging Face LLaMA folder here (new or empty).")],
    step: Annotated[
        int | None, typer.Option("--step", help="The checkpoint (steps completed); default: the newest that "
                                                "verifies.")
    ] = None,
    max_shard_mb: Annotated[
        float, typer.Option("--max-shard-mb", help="Shard the weights above this many MiB (default 5120).")
    ] = 5120.0,
    as_json: Annotated[bool, typer.Option("--json", help="One JSON object on stdout.")] = False,
) -> None:
    """Write a run's trained weights (every stage merged) as a Hugging Face folder: config.json and
    safetensors (sharded with an index above --max-shard-mb) that transformers' from_pretrained loads.

    Example: tfrun export runs/finetune --hf runs/finetune-hf
    """
    import dataclasses

    from tfrun.records.export import export_hf

    with user_errors(TfrunError):
        if not math.isfinite(max_shard_mb):  # (int() of it was a traceback; export_hf checks the rest)
            raise TfrunError(f"--max-shard-mb must be a finite number > 0, got {max_shard_mb:g}")
        result = export_hf(run_dir, hf_out, step=step, max_shard_bytes=int(max_shard_mb * 2**20))
    if as_json:
        print(json.dumps(dataclasses.asdict(result)))
        return
    console = Console(highlight=False, soft_wrap=True, stderr=True)
    for line in result.warnings:
        console.print(f"[yellow]warning:[/yellow] {line}")
    Console(highlight=False, soft_wrap=True).print(
        f"exported step {result.step} of {run_dir}: {result.num_params:,} parameters in {len(result.files)} "
        f"file{'s' * (len(result.files) != 1)} to {result.out}", markup=False)


def main() -> None:
    """Console-script entry point."""
    try:
        app()
    finally:
        # The interpreter's last collection walks every object torch's imports made: 0.8-0.9 s of a `tfrun train`
        # launcher's exit on 2 cores, 0.2 s once they are frozen (gc.freeze: kept from that collection). Nothing
        # of ours waits on that collection; exit handlers still run.
        gc.freeze()


if __name__ == "__main__":  # pragma: no cover
    main()
