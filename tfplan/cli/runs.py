"""The commands about measured runs: `tfplan profile` (make a profile) and `tfplan explain` (why a run's step
differs from its plan's prediction). Registered on the app in tfplan.cli.app."""

from __future__ import annotations

import json
from typing import Annotated

import typer
from rich.table import Table

from tfplan.cli.options import JsonOpt, LayersPerStageOpt, out, parse_int_list, user_errors
from tfplan.cost.measured import measure_profile
from tfplan.errors import TfplanError
from tfplan.fileio import check_output, write_json_atomic


def profile_cmd(
    output: Annotated[str, typer.Option("--output", "-o", help="Profile JSON to write.")],
    model: Annotated[
        str | None,
        typer.Option(
            "--model", help="Model: llama3.2-1b/3b, llama3.1-8b/70b (analytic); tiny (default), small, ..., or "
                            "hf:DIR, a Hugging Face checkpoint folder of LLaMA, Qwen2, Qwen3 or Mistral (measured)."
        ),
    ] = None,
    stages: Annotated[
        int, typer.Option("--stages", help="Pipeline stages, one per rank (the paper's sense).", min=1)
    ] = 2,
    stages_per_rank: Annotated[
        int | None,
        typer.Option("--stages-per-rank", help="Model chunks per rank V (default: 1 analytic, the schedule's "
                                               "measured); the profile holds stages x V chunks.", min=1),
    ] = None,
    analytic: Annotated[
        bool, typer.Option("--analytic", help="Cost model (no GPU needed) instead of measuring.")
    ] = False,
    gpu: Annotated[str, typer.Option("--gpu", help="Analytic: a100, h100, h200.")] = "h200",
    microbatch_size: Annotated[int, typer.Option("--microbatch-size", help="Sequences per micro-batch.", min=1)] = 4,
    seq_len: Annotated[int, typer.Option("--seq-len", help="Tokens per sequence.", min=1)] = 128,
    mfu: Annotated[float | None, typer.Option("--mfu", help="Analytic: achieved fraction of peak bf16 FLOP/s.")] = None,
    link: Annotated[str, typer.Option("--link", help="Analytic: nvlink, pcie or ib between ranks.")] = "nvlink",
    layers_per_stage: LayersPerStageOpt = None,
    per_layer: Annotated[
        bool,
        typer.Option("--per-layer", help="Analytic: write the per-layer profile (split into stages at planning time)."),
    ] = False,
    microbatches: Annotated[
        int, typer.Option("--microbatches", "-m", help="Measured: micro-batches per step.", min=1)
    ] = 8,
    schedule: Annotated[
        str, typer.Option("--schedule", help="Measured: the schedule to profile (any tfrun runs; the other "
                                             "backward style is timed on its counterpart).")
    ] = "1f1b",
    steps: Annotated[
        int, typer.Option("--steps", help="Measured: steps per measuring run (4 runs, 2 steps untimed each).", min=3)
    ] = 20,
    repeat: Annotated[
        int, typer.Option("--repeat", help="Measured: measure N times, keep the most consistent set.", min=1)
    ] = 1,
    dp: Annotated[
        int, typer.Option("--dp", help="Measured: with this many data-parallel replicas (their gradient reduction "
                                       "lands in the tails; the profile's dp).", min=1)
    ] = 1,
    init_from: Annotated[
        str | None, typer.Option("--init-from", help="Measured: from this tfrun run's latest weights (the noise scale "
                                                     "depends on them: profile a fine-tuning job at its checkpoint).")
    ] = None,
    data: Annotated[str | None, typer.Option("--data", help="Measured: training text, or 'stdlib'.")] = None,
    work_dir: Annotated[
        str | None, typer.Option("--work-dir", help="Measured: keep the measuring runs here (default: a temp "
                                                    "folder).")
    ] = None,
    noise_scale: Annotated[
        str | None, typer.Option("--noise-scale", help="Analytic: the gradient noise scale in tokens (one value, or "
                                                       "one per stage), for --objective goodput.")
    ] = None,
    grad_sq_share: Annotated[
        str | None, typer.Option("--grad-sq-share", help="Analytic: each stage's share of |G|^2 (one per stage, "
                                                         "summing to 1; default equal).")
    ] = None,
    as_json: JsonOpt = False,
) -> None:
    """Make a profile: measured inside the pipeline by tfrun (needs torch), or --analytic from a cost model.
    A measured profile records its own quality (spread per action, replay gap) and warns when unstable.

    Examples:
      tfplan profile --model tiny --stages 2 --microbatches 8 --output profile.json
      tfplan profile --model tiny --stages 2 --schedule interleaved-zb --stages-per-rank 2 -o zb.json --repeat 3
      tfplan profile --analytic --model llama3-8b --gpu h200 --stages 4 --microbatch-size 1 --seq-len 2048 -o p.json
    """
    from tfplan.cost import profile as profile_mod

    with user_errors():
        if analytic:
            from tfplan.cost import costmodel, hardware

            if model is None:
                raise TfplanError(f"--analytic needs --model; known: {', '.join(hardware.MODELS)}")
            kwargs = {"mfu": mfu} if mfu is not None else {}
            prof = costmodel.analytic_profile(model, gpu, microbatch_size, seq_len, link=link, **kwargs)
            if not per_layer:
                prof = profile_mod.split_profile(
                    prof, stages * (stages_per_rank or 1), parse_int_list(layers_per_stage, "--layers-per-stage")
                )
            if noise_scale is not None:
                prof = given_noise(prof, noise_scale, grad_sq_share, microbatch_size * seq_len)
            check_output(output)
            write_json_atomic(output, prof.to_dict())
        else:
            if noise_scale is not None or grad_sq_share is not None:
                raise TfplanError("--noise-scale and --grad-sq-share are for --analytic profiles: a measured "
                                  "profile measures its noise scale")
            check_output(output)  # before measuring, which takes a minute or more
            prof = measure_profile(output, model or "tiny", stages, stages_per_rank, microbatches, schedule, steps,
                                   microbatch_size, seq_len, repeat, dp, init_from, data, work_dir)
        if as_json:
            print(json.dumps(prof.to_dict()))
            return
        rows = prof.stages if prof.stages is not None else prof.layers
        table = Table(
            title=f"profile {prof.name} ({prof.source.get('kind')}), p2p {prof.p2p_ms:.4g} ms, dispatch "
            f"{prof.dispatch_ms:.4g} ms, overhead {prof.step_overhead_ms:.4g} ms",
            title_justify="left",
            show_edge=False,
        )
        for col in ("stage" if prof.stages is not None else "layer", "F", "B", "B frozen", "I", "W", "W frozen",
                    "tail"):
            table.add_column(col, justify="right")
        fields = profile_mod.COST_FIELDS + profile_mod.OPTIONAL_COST_FIELDS
        for i, c in enumerate(rows):
            table.add_row(c.name or str(i), *(f"{getattr(c, f):.3f}" for f in fields))
        console = out()
        console.print(table)
        quality = prof.quality or {}
        if quality:
            gap = quality.get("replay_gap")
            console.print(f"quality: {quality.get('steps')} timed steps, largest spread "
                          f"{quality.get('max_spread', 0):.0%}, replay gap {'-' if gap is None else f'{gap:+.1%}'}")
        for warning in quality.get("warnings", [])[:8]:
            console.print(f"[yellow]warning:[/yellow] {warning}")
        if len(quality.get("warnings", [])) > 8:
            console.print(f"[yellow]warning:[/yellow] and {len(quality['warnings']) - 8} more (quality.warnings)")
        console.print(f"profile written to {output} (times in ms per micro-batch)")


def given_noise(prof, noise_scale: str, grad_sq_share: str | None, microbatch_tokens: int):
    """The profile with a noise section the user gave (--noise-scale, --grad-sq-share), one value per stage or
    layer of the profile (a single noise scale applies to all; shares default equal)."""
    import dataclasses

    from tfplan.cost import goodput

    count = len(prof.stages if prof.stages is not None else prof.layers)
    scales = _floats(noise_scale, "--noise-scale")
    scales = scales * count if len(scales) == 1 else scales
    shares = _floats(grad_sq_share, "--grad-sq-share") if grad_sq_share else [1.0 / count] * count
    obj = {"noise_scale_tokens": scales, "grad_sq_share": shares, "microbatch_tokens": microbatch_tokens,
           "source": "given", "note": "given on the command line", **goodput.given_model(count, shares)}
    try:
        return dataclasses.replace(prof, noise=goodput.from_dict(obj, count, microbatch_tokens))
    except TfplanError as exc:  # name the option, not the file field
        field = str(exc).split(":")[0].removeprefix("noise.").split("[")[0]
        option = {"noise_scale_tokens": "--noise-scale", "grad_sq_share": "--grad-sq-share"}.get(field, field)
        raise TfplanError(f"{option}: {str(exc).split(': ', 1)[1]}") from None


def _floats(text: str, option: str) -> list[float]:
    try:
        return [float(x) for x in text.split(",")]
    except ValueError:
        raise TfplanError(f"{option}: numbers, comma-separated, got {text!r}") from None


def explain_cmd(
    run_dir: Annotated[str, typer.Argument(help="A `tfrun train` output folder (run_config, timings, summary).")],
    plan: Annotated[str | None, typer.Option("--plan", help="The plan to compare with (default: the run's).")] = None,
    trace: Annotated[
        str | None, typer.Option("--trace", help="Write predicted and measured timelines as one Chrome trace.")
    ] = None,
    top: Annotated[int, typer.Option("--top", help="How many of the largest residuals to list.", min=1)] = 10,
    as_json: JsonOpt = False,
) -> None:
    """Why a run's step time differs from its plan's prediction: the step split into actions, waits, tails
    and the rest; residuals by stage and kind and the largest ones; predicted and measured critical paths;
    both timelines.

    Example: tfplan explain runs/plan --trace explain.json
    """
    from tfplan.report import explain

    with user_errors():
        ex = explain.explain(run_dir, plan)
        if trace:
            write_json_atomic(trace, explain.chrome_trace(ex))
        if as_json:
            print(json.dumps(ex.to_dict()))
            return
        render_explanation(ex, top)
        if trace:
            out().print(f"trace written to {trace} (open in https://ui.perfetto.dev)")


def render_explanation(ex, top: int) -> None:
    """The explanation for people (tables and timelines)."""
    from tfplan.report.render import timeline

    console = out()
    console.print(f"[bold]{ex.run_dir}[/bold] (freeze {ex.freeze}): measured step {ex.measured_step_ms:.1f} ms, "
                  f"predicted {ex.predicted_step_ms:.1f} ms, error {ex.error:+.1%}")
    speeds = ", ".join(f"{k} x{v:.2f}" for k, v in ex.kind_speed.items())
    console.print(f"at the run's speed per kind ({speeds}: measured over predicted time) the prediction is "
                  f"{ex.speed_step_ms:.1f} ms, error {ex.speed_error:+.1%}; at the forwards' speed alone "
                  f"{ex.predicted_step_ms * ex.forward_speed:.1f} ms, error {ex.speed_adjusted_error:+.1%}")
    if ex.learning is not None:
        lr = ex.learning
        realised = ("-" if lr["realised_efficiency"] is None else
                    f"{lr['realised_efficiency']:.3f} at the run's realised ratios "
                    + ", ".join(f"{r:.2f}" for r in lr["realised_ratios"]))
        console.print(f"learning ({lr['learning_model']} model, {lr['batch_tokens']:,.0f} tokens a step): the plan "
                      f"predicted an efficiency of {lr['planned_efficiency']:.3f} at its ratios "
                      + ", ".join(f"{r:.2f}" for r in lr["planned_ratios"]) + f"; {realised}")
    per_kind = Table(title="time per action kind (ms, summed over the step's actions)", title_justify="left",
                     show_edge=False)
    for col in ("kind", "count", "predicted", "measured", "measured / predicted"):
        per_kind.add_column(col, justify="right")
    for kind, n, p, m in ex.by_kind():
        per_kind.add_row(kind, str(n), f"{p:.1f}", f"{m:.1f}", f"{m / p:.2f}" if p > 0 else "-")
    console.print(per_kind)
    parts = Table(title="where the step's time goes (ms)", title_justify="left", show_edge=False)
    for col in ("part", "predicted", "measured", "difference"):
        parts.add_column(col, justify="right" if col != "part" else "left")
    for name, (p, m) in ex.parts.items():
        parts.add_row(name, f"{p:.1f}", f"{m:.1f}", f"{m - p:+.1f}")
    console.print(parts)
    split = ", ".join(f"{k} {v:+.1f}" for k, v in ex.error_parts.items())
    console.print(f"error split (ms): {split}  (actions: measured action times replayed on the DAG; waits: "
                  "measured makespan beyond that replay)")
    if ex.waits_split is not None:
        console.print(f"waits (ms): variability {ex.waits_split['variability']:+.1f} (each step replayed with its "
                      f"own action times, beyond the replay of the medians), idle {ex.waits_split['idle']:+.1f} "
                      "(between actions, unexplained by any replay)")
    kinds = Table(title="residuals by stage and kind (ms per action; sum over the step)", title_justify="left",
                  show_edge=False)
    for col in ("action", "count", "predicted", "measured", "sum of residuals"):
        kinds.add_column(col, justify="right")
    for key, n, p, m, r in ex.by_stage_kind():
        kinds.add_row(key, str(n), f"{p:.2f}", f"{m:.2f}", f"{r:+.1f}")
    console.print(kinds)
    largest = Table(title=f"largest residuals (top {top})", title_justify="left", show_edge=False)
    for col in ("action", "rank", "predicted ms", "measured ms", "predicted start", "measured start"):
        largest.add_column(col, justify="right")
    for a in ex.largest(top):
        largest.add_row(a.action, str(a.rank), f"{a.predicted_ms:.2f}", f"{a.measured_ms:.2f}",
                        f"{a.predicted_start_ms:.1f}", f"{a.measured_start_ms:.1f}")
    console.print(largest)
    console.print("predicted critical path: " + " ".join(ex.predicted_path))
    console.print("measured critical path:  " + " ".join(ex.measured_path))
    dag = ex.predicted_dag
    span = (0.0, max(ex.predicted.makespan_ms, ex.measured.makespan_ms))
    width = min(console.width, 160)
    console.print("predicted timeline")
    console.print(timeline(dag, ex.predicted, width, span))
    console.print("measured timeline (median start and duration of every action)")
    console.print(timeline(dag, ex.measured, width, span))
