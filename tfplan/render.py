"""Terminal rendering for people: summary tables, rank timelines, freeze-ratio heat maps.

Pure functions from computed results to rich renderables; the CLI prints them. Nothing here computes a
number that the simulator or solver did not.
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np
from rich.console import Console
from rich.table import Table
from rich.text import Text

from tfplan.actions import parse_action
from tfplan.dag import Dag
from tfplan.simulate import Simulation, simulate

KIND_STYLE = {
    "F": "black on bright_cyan",
    "B": "black on bright_green",
    "I": "black on yellow",
    "W": "white on magenta",
}
KIND_NAME = {"F": "forward", "B": "full backward", "I": "input-grad backward", "W": "weight-grad backward"}
MAX_PANELS = 40  # --gantt windows at most
IDLE = "\u00b7"  # middle dot; the only non-ASCII glyph we print (rich renders it everywhere)
TAIL = "~"  # a rank's tail after its last action


def summary_table(dag: Dag, sim: Simulation, title: str) -> Table:
    """Makespan, bubble fraction and per-rank utilisation."""
    table = Table(title=title, title_justify="left", show_edge=False)
    table.add_column("rank", justify="right")
    table.add_column("stages", justify="left")
    table.add_column("busy ms", justify="right")
    table.add_column("idle ms", justify="right")
    table.add_column("utilisation", justify="right")
    stages_of: dict[int, list[int]] = {}
    for stage, rank in enumerate(dag.schedule.stage_to_rank):
        stages_of.setdefault(rank, []).append(stage)
    for r, (busy, idle) in enumerate(zip(sim.busy_ms, sim.idle_ms)):
        util = busy / sim.makespan_ms if sim.makespan_ms > 0 else 0.0
        table.add_row(str(r), ",".join(map(str, stages_of[r])), f"{busy:.3f}", f"{idle:.3f}", f"{util:.1%}")
    return table


def headline(dag: Dag, sim: Simulation) -> Text:
    s = dag.schedule
    text = Text()
    text.append(f"{s.name}", style="bold")
    text.append(f": {s.num_ranks} ranks, {s.num_stages} stages, {s.num_microbatches} micro-batches, ")
    text.append(f"{dag.num_nodes} actions\n")
    text.append("step time ")
    text.append(f"{sim.batch_time_ms:.3f} ms", style="bold")
    if sim.step_overhead_ms:
        text.append(f" (DAG {sim.makespan_ms:.3f} + overhead {sim.step_overhead_ms:.3f})")
    text.append(f", bubble fraction {sim.bubble_fraction:.1%}, critical path {len(sim.critical_path)} actions")
    return text


def _label(dag: Dag, node: int, width: int) -> str:
    # Leave at least one blank column so neighbouring blocks stay apart without colour. With one stage per
    # rank the row already says the stage, so the label is kind + micro-batch.
    a = dag.actions[node]
    labels = (f"{a.kind}{a.mb}",) if dag.schedule.stages_per_rank == 1 else (str(a), f"{a.kind}{a.mb}")
    for label in labels:
        if len(label) < width:
            return (" " + label).ljust(width)
    for label in labels:
        if len(label) == width:
            return label  # no room for the blank; the colour still separates the blocks
    return a.kind.ljust(width)


def timeline(dag: Dag, sim: Simulation, width: int, span: tuple[float, float] | None = None) -> Text:
    """One row per rank, time flowing right; blocks coloured and lettered by kind (F/B/I/W) with the
    micro-batch number where it fits; a rank's tail after its last action (tfplan.dag Note [rank tails]:
    optimizer, gradient reduction) as `~`; idle time dotted.

    Args:
        width: total columns including the row label.
        span: (t0, t1) ms shown; None = the whole step.
    """
    t0, t1 = span if span is not None else (0.0, sim.makespan_ms)
    label_w = 8
    cols = max(10, width - label_w)
    scale = cols / (t1 - t0) if t1 > t0 else 0.0
    rows: list[list[tuple[str, str]]] = [[(IDLE, "dim")] * cols for _ in range(dag.schedule.num_ranks)]
    for v in _painters(dag, sim, t0, t1, scale, cols):
        s, e = sim.start_ms[v], sim.end_ms[v]
        if e <= t0 or s >= t1:
            continue
        c0 = max(0, round((s - t0) * scale))
        c1 = min(cols, round((e - t0) * scale))
        if c1 <= c0:
            if e > s and c0 < cols:
                c1 = c0 + 1  # keep a visible sliver for very short actions
            else:
                continue
        kind = dag.actions[v].kind
        text = _label(dag, v, c1 - c0)
        row = rows[dag.rank[v]]
        for k in range(c1 - c0):
            row[c0 + k] = (text[k] if k < len(text) else " ", KIND_STYLE[kind])
    for v, tail in dag.finish():
        if tail <= 0:
            continue
        c0 = max(0, round((sim.end_ms[v] - t0) * scale))
        c1 = min(cols, max(c0 + 1, round((sim.end_ms[v] + tail - t0) * scale)))  # at least a sliver
        for k in range(c0, c1):
            rows[dag.rank[v]][k] = (TAIL, "magenta")
    out = Text()
    for r, row in enumerate(rows):
        out.append(f"rank {r:<3}".ljust(label_w))
        for ch, style in row:
            out.append(ch, style=style)
        out.append("\n")
    axis = f"{t0:.3g} ms".ljust(cols // 2) + f"{t1:.3g} ms".rjust(cols - cols // 2)
    out.append(" " * label_w + axis + "\n", style="dim")
    return out


def _painters(dag: Dag, sim: Simulation, t0: float, t1: float, scale: float, cols: int) -> list[int]:
    """The nodes whose blocks timeline() must paint, in node order: those in the span, less each one-column
    block that the next block of its rank paints over (same column). A rank's blocks never go back in time,
    so the rest are exactly what the timeline shows; at a million actions most blocks are a column's sliver
    and this leaves about one per column (vectorised; the same columns as painting every node)."""
    start, end = np.asarray(sim.start_ms), np.asarray(sim.end_ms)
    c0 = np.maximum(0.0, np.rint((start - t0) * scale))  # np.rint rounds half to even, as round() does
    c1 = np.minimum(float(cols), np.rint((end - t0) * scale))
    narrow = c1 <= c0
    shown = (end > t0) & (start < t1) & (~narrow | ((end > start) & (c0 < cols)))
    idx = np.flatnonzero(shown)
    c0, c1 = c0[idx], np.where(narrow[idx], c0[idx] + 1, c1[idx])
    rank = np.asarray(dag.rank)[idx]
    covered = np.zeros(len(idx), dtype=bool)
    covered[:-1] = (rank[1:] == rank[:-1]) & (c0[1:] == c0[:-1]) & (c1[:-1] - c0[:-1] == 1)
    return idx[~covered].tolist()


def legend(kinds: set[str]) -> Text:
    text = Text("legend: ")
    for kind in ("F", "B", "I", "W"):
        if kind in kinds:
            text.append(f" {kind} ", style=KIND_STYLE[kind])
            text.append(f" {KIND_NAME[kind]}  ")
    text.append(f"{IDLE} idle", style="dim")
    text.append(f"  {TAIL} tail (optimizer, gradient reduction)", style="magenta")
    return text


def gantt_panels(dag: Dag, sim: Simulation, width: int, min_cols_per_action: int = 5) -> list[Text]:
    """The full timeline split into consecutive windows so that every action gets at least
    `min_cols_per_action` columns (its full label) at any step size."""
    shortest = min((d for d in (e - s for s, e in zip(sim.start_ms, sim.end_ms)) if d > 0), default=1.0)
    cols = max(10, width - 8)
    # At most MAX_PANELS windows: an action far shorter than the rest only gets its kind letter.
    window = max(shortest * cols / min_cols_per_action, sim.makespan_ms / MAX_PANELS, 1e-12)
    panels, t = [], 0.0
    while t < sim.makespan_ms - 1e-12:
        panels.append(timeline(dag, sim, width, span=(t, min(sim.makespan_ms, t + window))))
        t += window
    return panels


def grid_table(order_rows: Sequence[Sequence[str]], title: str) -> Table:
    """The rank x step grid of a schedule (action strings)."""
    table = Table(title=title, title_justify="left", show_edge=False, pad_edge=False)
    table.add_column("rank", justify="right", style="bold")
    steps = max(len(r) for r in order_rows)
    for step in range(steps):
        table.add_column(str(step), justify="center")
    for r, row in enumerate(order_rows):
        cells = [Text(a, style=KIND_STYLE[parse_action(a).kind]) for a in row] + [Text("")] * (steps - len(row))
        table.add_row(str(r), *cells)
    return table


def plan_summary(plan) -> Table:
    """No-freeze vs planned vs all-frozen vs naive uniform freezing: step time, speedup, bubbles."""
    p = plan.predicted
    table = Table(title="predicted step time", title_justify="left", show_edge=False)
    for col, justify in (("plan", "left"), ("step ms", "right"), ("speedup", "right"), ("note", "left")):
        table.add_column(col, justify=justify)
    mean = p.mean_freeze_ratio
    table.add_row("no freezing", f"{p.no_freeze_ms:.3f}", "1.000x", f"bubbles {p.no_freeze_bubble_fraction:.1%}")
    table.add_row(
        Text("TimelyFreeze plan", style="bold"),
        Text(f"{p.planned_ms:.3f}", style="bold"),
        Text(f"{p.speedup:.3f}x", style="bold green"),
        f"bubbles {p.planned_bubble_fraction:.1%}, mean ratio {mean:.3f}",
    )
    table.add_row(
        "uniform freezing, same mean",
        f"{p.uniform_ms:.3f}",
        f"{p.no_freeze_ms / p.uniform_ms:.3f}x",
        "naive baseline: every B/W at the plan's mean ratio",
    )
    table.add_row(
        "everything frozen",
        f"{p.all_frozen_ms:.3f}",
        f"{p.no_freeze_ms / p.all_frozen_ms:.3f}x",
        "cap 1 optimum (bound)",
    )
    return table


def stage_table(plan) -> Table:
    """Per stage: cap, mean planned ratio, and how much of the cap is used."""
    table = Table(title="freeze ratio per stage", title_justify="left", show_edge=False)
    for col in ("stage", "rank", "cap", "mean ratio", "used"):
        table.add_column(col, justify="right")
    for s, (cap, mean) in enumerate(zip(plan.caps, plan.mean_ratio_per_stage())):
        used = f"{mean / cap:.0%}" if cap > 0 else "-"
        table.add_row(str(s), str(plan.schedule.stage_to_rank[s]), f"{cap:.2f}", f"{mean:.3f}", used)
    return table


_SHADES = ["dark_green", "green4", "green3", "yellow3", "orange3", "dark_orange", "red3", "red1"]


def _ratio_cell(r: float, cell: int) -> tuple[str, str]:
    """A ratio as a `cell`-wide label (" .65", " 1.0", " -- ") and its background shade."""
    if r <= 0:
        return " --".rjust(cell), "dim"
    label = " 1.0" if r >= 0.995 else f"{r:.2f}"[1:]  # .995 would print as "1.00"
    shade = _SHADES[min(len(_SHADES) - 1, round(r * (len(_SHADES) - 1)))]
    return label.rjust(cell), f"black on {shade}"


def heat_map(plan, width: int) -> Text:
    """Stage x micro-batch map of freeze ratios (of each (stage, mb)'s B or W action); micro-batches are
    averaged in bins when they do not fit the width."""
    m = plan.schedule.num_microbatches
    grid = plan.ratio_table()
    cell = 4
    per_bin = max(1, -(-m * cell // max(cell, width - 10)))  # micro-batches per column, ceil
    bins = [range(i, min(m, i + per_bin)) for i in range(0, m, per_bin)]
    out = Text(
        "freeze ratio per (stage, micro-batch)"
        + (f", {per_bin} micro-batches per column" if per_bin > 1 else "")
        + "\n",
        style="bold",
    )
    header = "".join(f"{b.start:>{cell}}" for b in bins)
    out.append("mb      " + header + "\n", style="dim")
    for s, row in enumerate(grid):
        out.append(f"stage {s:<2}")
        for b in bins:
            r = sum(row[i] for i in b) / len(b)
            out.append(*_ratio_cell(r, cell))
        out.append("\n")
    return out


def sweep_table(rows, title: str):
    """The what-if sweep: one line per (schedule, micro-batches, cap); combinations a schedule cannot run
    are listed under the table with the reason."""
    from rich.console import Group

    table = Table(title=title, title_justify="left", show_edge=False)
    with_dp = any(r.dp > 1 for r in rows)
    learning = any(r.goodput is not None for r in rows)
    cols = (
        "schedule",
        "M",
        *(("DP",) if with_dp else ()),
        "cap",
        "no-freeze ms",
        "planned ms",
        "speedup",
        "bubbles before",
        "after",
        "mean ratio",
        "uniform same mean",
        "plan vs uniform",
        *(("batch tokens", "goodput", "best goodput (ratio)") if learning else ()),
    )
    for col in cols:
        table.add_column(col, justify="left" if col == "schedule" else "right", no_wrap=col == "schedule")
    reasons: list[str] = []
    for r in rows:
        if r.skipped:
            if r.skipped not in reasons:
                reasons.append(r.skipped)
            note = Text(f"n/a [{reasons.index(r.skipped) + 1}]", style="dim")
            table.add_row(r.schedule, str(r.num_microbatches), *((str(r.dp),) if with_dp else ()), f"{r.cap:g}", note)
            continue
        feasible = r.status == "FEASIBLE"
        table.add_row(
            r.schedule,
            str(r.num_microbatches),
            *((str(r.dp),) if with_dp else ()),
            f"{r.cap:g}",
            f"{r.no_freeze_ms:.3f}",
            f"{r.planned_ms:.3f}",
            Text(f"{r.speedup:.3f}x" + ("*" if feasible else ""), style="bold"),
            f"{r.bubble_before:.1%}",
            f"{r.bubble_after:.1%}",
            f"{r.mean_freeze_ratio:.3f}",
            f"{r.uniform_speedup:.3f}x",
            f"{r.uniform_ms / r.planned_ms:.3f}x",
            *((f"{r.batch_tokens:,.0f}", f"{r.goodput:.3f}x", f"{r.best_goodput:.3f}x ({r.best_goodput_ratio:.2f})")
              if learning and r.goodput is not None else ()),
        )
    lines = [f"[{i}] {reason}\n" for i, reason in enumerate(reasons, start=1)]
    if learning:
        lines.append("goodput: predicted learning per second over no freezing (tfplan.goodput); best: the goodput "
                     "plan at that cap, 1.000x when freezing does not pay at that batch\n")
    if any(r.status == "FEASIBLE" for r in rows):
        lines.append("* feasible, not certified optimal: the time limit stopped the solve (--time-limit)\n")
    notes = Text("".join(lines), style="dim")
    return Group(table, notes) if lines else table


# ---------------------------------------------------------------------------------------------------------
# Whole views and JSON summaries used by the CLI


def simulation_json(dag, sim: Simulation, freeze_ratio: float, profile_name: str) -> dict:
    s = dag.schedule
    return {
        "profile": profile_name,
        "schedule": s.name,
        "num_ranks": s.num_ranks,
        "num_stages": s.num_stages,
        "num_microbatches": s.num_microbatches,
        "stages_per_rank": s.stages_per_rank,
        "num_actions": dag.num_nodes,
        "freeze_ratio": freeze_ratio,
        "batch_time_ms": sim.batch_time_ms,
        "makespan_ms": sim.makespan_ms,
        "step_overhead_ms": sim.step_overhead_ms,
        "bubble_fraction": sim.bubble_fraction,
        "busy_ms": sim.busy_ms,
        "idle_ms": sim.idle_ms,
        "critical_path": [str(dag.actions[v]) for v in sim.critical_path],
    }


def render_plan(plan_obj, console: Console, title: str) -> None:
    """The people's view of a plan: summary, per-stage ratios, heat map, before/after timelines."""
    dag = plan_obj.dag
    none, planned = plan_obj.timelines or (simulate(dag), simulate(dag, dag.durations(list(plan_obj.ratios))))
    console.print(Text(title, style="bold"))
    for line in plan_notes(plan_obj):
        console.print(line)
    console.print(plan_summary(plan_obj))
    console.print(stage_table(plan_obj))
    console.print(heat_map(plan_obj, console.width))
    console.print(legend({a.kind for a in dag.actions}))
    console.print(Text(f"before: no freezing, {none.batch_time_ms:.3f} ms", style="bold"))
    console.print(timeline(dag, none, console.width, span=(0.0, none.makespan_ms)), end="")
    console.print(Text(f"after: TimelyFreeze plan, {planned.batch_time_ms:.3f} ms (same time scale)", style="bold"))
    console.print(timeline(dag, planned, console.width, span=(0.0, none.makespan_ms)), end="")


def plan_notes(plan_obj) -> list[str]:
    """One line each: the plan's predicted goodput (tfplan.goodput), or that freezing does not pay at this
    batch; the stage-0 anchor's cost when it has one (tfplan.job Note [stage-0 anchor])."""
    lines = []
    g = plan_obj.goodput
    if g is not None:
        scales = ", ".join(f"{n:,.0f}" for n in g.noise.noise_scale_tokens)
        if g.objective == "goodput" and not any(plan_obj.ratios):
            lines.append(f"freezing does not pay at this batch ({g.batch_tokens:,.0f} tokens a step; noise scales "
                         f"{scales} tokens per stage): the plan freezes nothing")
        else:
            lines.append(f"predicted goodput {g.value.goodput:.3f}x unfrozen training's (learning per step "
                         f"{g.value.efficiency:.3f}x, steps per second {g.value.speedup:.3f}x; batch "
                         f"{g.batch_tokens:,.0f} tokens, noise scales {scales} tokens per stage; solved for "
                         f"{g.objective})" + ("" if g.pays else ": freezing does not pay here"))
    if plan_obj.anchor_cost_ms > 0:
        share = plan_obj.anchor_cost_ms / plan_obj.predicted.planned_ms
        lines.append(f"the stage-0 anchor costs {plan_obj.anchor_cost_ms:.3f} ms a step ({share:.2%}): one stage-0 "
                     "backward left unfrozen (--no-stage0-anchor turns it off)")
    return lines


def plan_json(plan_obj) -> dict:
    p = plan_obj.predicted
    return {
        "schedule": plan_obj.schedule.name,
        "num_ranks": plan_obj.schedule.num_ranks,
        "num_stages": plan_obj.schedule.num_stages,
        "num_microbatches": plan_obj.schedule.num_microbatches,
        "max_freeze_ratio": list(plan_obj.caps),
        "mean_freeze_ratio": plan_obj.mean_ratio_per_stage(),
        **p.to_dict(),
        "solver": None if plan_obj.solver is None else plan_obj.solver.to_dict(),
        "anchor_cost_ms": plan_obj.anchor_cost_ms,
        "goodput": None if plan_obj.goodput is None else plan_obj.goodput.to_dict(),
    }


def plan_title(plan_obj) -> str:
    s = plan_obj.schedule
    solver = plan_obj.solver
    solved = ""
    if solver is not None:
        solved = f", solved by {solver.backend} in {solver.wall_s:.3f} s"
        if solver.status != "OPTIMAL":
            gaps = [f"{p.name} gap {p.gap:.3g}" for p in solver.phases if p.gap is not None and p.status != "OPTIMAL"]
            solved += f" ({solver.status}, not certified optimal{': ' + ', '.join(gaps) if gaps else ''})"
    return (
        f"{s.name}: {s.num_ranks} ranks, {s.num_stages} stages, {s.num_microbatches} micro-batches, "
        f"profile {plan_obj.profile_name}{solved}"
    )
