"""Terminal rendering of a step for people: summary tables, rank timelines, schedule grids (plans: plan_view).

Pure functions from computed results to rich renderables; the CLI prints them. Nothing here computes a
number that the simulator or solver did not.
"""

from __future__ import annotations

import bisect
from collections.abc import Sequence

from rich.table import Table
from rich.text import Text

from tfplan.schedule.actions import parse_action
from tfplan.step.dag import Dag
from tfplan.step.simulate import Simulation

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
    micro-batch number where it fits; a rank's tail after its last action (tfplan.step.dag Note [rank tails]:
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
    """The nodes whose blocks timeline() must paint, in node order: for each rank and column, the block that
    paints it last (painting only these leaves the same columns as painting every node in the span).

    Within a rank blocks never go back in time (each starts after the one before ends), so a block's columns
    [c0, c1) can overlap only the next block's, when both start in the same column (a one-column sliver painted
    over). The last painter of column k is therefore the last shown block with c0 <= k, if it reaches past k:
    one binary search per (rank, column) over the rank's start times: 0.02 s at a million actions where a numpy
    pass over every node took 0.3 s (1F1B 32 x 16384, 120 columns)."""
    start, end = sim.start_ms, sim.end_ms

    def col(t: float) -> int:  # timeline()'s c0 of a block starting at t (round() rounds half to even)
        return max(0, round((t - t0) * scale))

    def first_col(v: int) -> int:
        return col(start[v])

    def last_col(v: int) -> int:  # c1 as timeline() paints it: at least one column for a block of some length
        c0, c1 = first_col(v), min(cols, round((end[v] - t0) * scale))
        if c1 > c0:
            return c1
        return c0 + 1 if end[v] > start[v] and c0 < cols else c0  # c0: not shown

    painters: set[int] = set()
    for lo, hi in dag.rank_bounds():
        for k in range(cols):
            v = bisect.bisect_right(start, k, lo, hi, key=col) - 1
            while v >= lo and end[v] > t0 and last_col(v) == first_col(v):
                v -= 1  # a block of no length paints nothing: the one before it may reach column k
            if v >= lo and end[v] > t0 and start[v] < t1 and last_col(v) > k:
                painters.add(v)
    return sorted(painters)


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


def grid_table(order_rows: Sequence[Sequence[str]], title: str, steps: range | None = None) -> Table:
    """The rank x step grid of a schedule (action strings), over `steps` (None: all of them)."""
    table = Table(title=title, title_justify="left", show_edge=False, pad_edge=False)
    table.add_column("rank", justify="right", style="bold")
    steps = range(max(len(r) for r in order_rows)) if steps is None else steps
    for step in steps:
        table.add_column(str(step), justify="center", no_wrap=True)
    for r, row in enumerate(order_rows):
        cells = [Text(row[s], style=KIND_STYLE[parse_action(row[s]).kind]) if s < len(row) else Text("")
                 for s in steps]
        table.add_row(str(r), *cells)
    return table


def grid_tables(order_rows: Sequence[Sequence[str]], title: str, width: int) -> list[Table]:
    """grid_table cut into windows of consecutive steps that fit `width` columns each, so that every cell keeps its
    whole action (one table of a few dozen steps at 80 columns was squeezed to blank cells)."""
    steps = max(len(r) for r in order_rows)
    cell = max([len(a) for r in order_rows for a in r] + [len(str(steps - 1))])
    per = max(1, (width - 7) // (cell + 3))  # the rank column and each step's, with their separators
    return [grid_table(order_rows, title if lo == 0 else f"(steps {lo}..{min(steps, lo + per) - 1})",
                       range(lo, min(steps, lo + per))) for lo in range(0, steps, per)]


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
