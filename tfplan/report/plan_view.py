"""A plan for people: predicted step times against the baselines, ratios per stage, the heat map, notes, the
before/after timelines (tfplan.report.render draws them), the plan's JSON summary for scripts, and the what-if
sweep's table of plans.

Pure functions from a tfplan.plan.plan.Plan to rich renderables; nothing here computes a number that the
simulator or solver did not.
"""

from __future__ import annotations

from rich.console import Console
from rich.table import Table
from rich.text import Text

from tfplan.report.render import legend, timeline
from tfplan.step.simulate import simulate


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
    """One line each: the plan's predicted goodput (tfplan.cost.goodput), or that freezing does not pay at this
    batch; the stage-0 anchor's cost when it has one (tfplan.plan.job Note [stage-0 anchor])."""
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
                         f"{g.batch_tokens:,.0f} tokens, noise scales {scales} tokens per stage; learning model "
                         f"{g.noise.learning_model}; solved for {g.objective})"
                         + ("" if g.pays else ": freezing does not pay here"))
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
        lines.append("goodput: predicted learning per second over no freezing (tfplan.cost.goodput); best: the goodput "
                     "plan at that cap, 1.000x when freezing does not pay at that batch\n")
    if any(r.status == "FEASIBLE" for r in rows):
        lines.append("* feasible, not certified optimal: the time limit stopped the solve (--time-limit)\n")
    notes = Text("".join(lines), style="dim")
    return Group(table, notes) if lines else table
