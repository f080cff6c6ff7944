"""Terminal rendering for people: summary tables, rank timelines, freeze-ratio heat maps.

Pure functions from computed results to rich renderables; the CLI prints them. Nothing here computes a
number that the simulator or solver did not.
"""

from __future__ import annotations

from collections.abc import Sequence

from rich.table import Table
from rich.text import Text

from tfplan.dag import Dag
from tfplan.simulate import Simulation

KIND_STYLE = {"F": "black on bright_cyan", "B": "black on bright_green", "I": "black on yellow", "W": "white on magenta"}
KIND_NAME = {"F": "forward", "B": "full backward", "I": "input-grad backward", "W": "weight-grad backward"}
IDLE = "\u00b7"  # middle dot; the only non-ASCII glyph we print (rich renders it everywhere)


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
    return a.kind.ljust(width)


def timeline(dag: Dag, sim: Simulation, width: int, span: tuple[float, float] | None = None) -> Text:
    """One row per rank, time flowing right; blocks coloured and lettered by kind (F/B/I/W) with the
    micro-batch number where it fits; idle time dotted.

    Args:
        width: total columns including the row label.
        span: (t0, t1) ms shown; None = the whole step.
    """
    t0, t1 = span if span is not None else (0.0, sim.makespan_ms)
    label_w = 8
    cols = max(10, width - label_w)
    scale = cols / (t1 - t0) if t1 > t0 else 0.0
    rows: list[list[tuple[str, str]]] = [[(IDLE, "dim")] * cols for _ in range(dag.schedule.num_ranks)]
    for v in range(dag.num_nodes):
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
    out = Text()
    for r, row in enumerate(rows):
        out.append(f"rank {r:<3}".ljust(label_w))
        for ch, style in row:
            out.append(ch, style=style)
        out.append("\n")
    axis = f"{t0:.3g} ms".ljust(cols // 2) + f"{t1:.3g} ms".rjust(cols - cols // 2)
    out.append(" " * label_w + axis + "\n", style="dim")
    return out


def legend(kinds: set[str]) -> Text:
    text = Text("legend: ")
    for kind in ("F", "B", "I", "W"):
        if kind in kinds:
            text.append(f" {kind} ", style=KIND_STYLE[kind])
            text.append(f" {KIND_NAME[kind]}  ")
    text.append(f"{IDLE} idle", style="dim")
    return text


def gantt_panels(dag: Dag, sim: Simulation, width: int, min_cols_per_action: int = 5) -> list[Text]:
    """The full timeline split into consecutive windows so that every action gets at least
    `min_cols_per_action` columns (its full label) at any step size."""
    shortest = min((d for d in (e - s for s, e in zip(sim.start_ms, sim.end_ms)) if d > 0), default=1.0)
    cols = max(10, width - 8)
    window = max(shortest * cols / min_cols_per_action, 1e-12)
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
        cells = [Text(a, style=KIND_STYLE[_kind(a)]) for a in row] + [Text("")] * (steps - len(row))
        table.add_row(str(r), *cells)
    return table


def _kind(action: str) -> str:
    return next(ch for ch in action if ch in "FBIW")
