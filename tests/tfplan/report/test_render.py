"""Terminal rendering: readable timelines (micro-batch numbers at 4 x 8 in 120 columns, kinds distinguishable),
gantt windows, heat map values, tables."""

from __future__ import annotations

import dataclasses
import re

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from rich.console import Console
from rich.text import Text

from tests.conftest import PROFILES
from tfplan.cost import profile
from tfplan.plan import plan as plan_mod
from tfplan.report import plan_view, render, sweep
from tfplan.schedule import schedules
from tfplan.schedule.actions import Action
from tfplan.solve import solver
from tfplan.step import dag as dag_mod
from tfplan.step.simulate import simulate

UNIFORM = PROFILES / "toy-uniform-4.json"
HETERO = PROFILES / "toy-hetero-4.json"
TOKEN = re.compile(r"([FBIW])(\d+)")


def _dag(name: str, p: int, m: int, path=UNIFORM) -> dag_mod.Dag:
    prof = profile.load(path)
    v = len(prof.stages) // p
    return dag_mod.build(schedules.generate(name, p, m, v), prof)


def _rank_rows(text: Text) -> list[str]:
    return [line for line in text.plain.split("\n") if line.startswith("rank ")]


def _tokens(row: str) -> set[str]:
    return {f"{k}{n}" for k, n in TOKEN.findall(row[8:])}


def _styles(text: Text) -> list[str | None]:
    styles: list[str | None] = [None] * len(text.plain)
    for span in text.spans:
        for i in range(span.start, span.end):
            styles[i] = str(span.style)
    return styles


def _render(renderable, width: int = 120) -> str:
    console = Console(width=width, record=True, color_system=None, highlight=False)
    console.print(renderable)
    return console.export_text()


@pytest.mark.parametrize(
    "path",
    [
        UNIFORM,
        HETERO,
    ],
    ids=["toy-uniform", "toy-hetero"],
)
def test_1f1b_4x8_timeline_at_120_columns_shows_every_micro_batch(path) -> None:
    dag = _dag("1f1b", 4, 8, path)
    text = render.timeline(dag, simulate(dag), 120)
    rows = _rank_rows(text)
    assert len(rows) == 4
    expected = {f"{k}{m}" for k in "FB" for m in range(8)}
    for r, row in enumerate(rows):
        assert len(row) == 120
        assert _tokens(row) == expected, f"rank {r}: missing {sorted(expected - _tokens(row))}"


def test_kinds_are_distinguishable_by_letter_and_colour() -> None:
    dag = _dag("interleaved-zb", 2, 8)
    sim = simulate(dag)
    text = render.timeline(dag, sim, 120)
    styles = _styles(text)
    plain = text.plain
    assert len(set(render.KIND_STYLE.values())) == 4
    seen = set()
    for i, ch in enumerate(plain):
        if ch in "FBIW" and styles[i] in render.KIND_STYLE.values():
            assert styles[i] == render.KIND_STYLE[ch], f"{ch} drawn in {styles[i]} at {i}"
            seen.add(ch)
    assert seen == {"F", "I", "W"}
    # Idle time is dotted and dim, and the busy columns of each rank add up to about its busy time.
    rows = [line for line in plain.split("\n") if line.startswith("rank ")]
    cols = 120 - 8
    for r, row in enumerate(rows):
        busy_cols = sum(ch != render.IDLE for ch in row[8:])
        assert busy_cols == pytest.approx(sim.busy_ms[r] / sim.makespan_ms * cols, abs=dag.num_nodes / 2 + 2)


def test_timeline_span_and_axis() -> None:
    dag = _dag("gpipe", 4, 4)
    sim = simulate(dag)
    text = render.timeline(dag, sim, 80, span=(0.0, sim.makespan_ms / 2))
    lines = text.plain.rstrip("\n").split("\n")
    assert lines[-1].split() == ["0", "ms", "10.5", "ms"]
    # In the first half of GPipe 4 x 4 only forwards (and the first backwards of the last rank) run.
    assert "B3" not in _tokens(lines[0])


def test_gantt_panels_label_every_action() -> None:
    dag = _dag("1f1b", 4, 8, HETERO)
    sim = simulate(dag)
    panels = render.gantt_panels(dag, sim, 120)
    assert len(panels) >= 2
    for r in range(4):
        tokens = set().union(*(_tokens(_rank_rows(p)[r]) for p in panels))
        assert tokens == {f"{k}{m}" for k in "FB" for m in range(8)}, r
    last_axis = panels[-1].plain.rstrip("\n").split("\n")[-1]
    assert last_axis.split()[-2:] == [f"{sim.makespan_ms:.3g}", "ms"]


def test_labels_include_the_stage_with_several_stages_per_rank() -> None:
    dag = _dag("interleaved-1f1b", 2, 2)
    panels = render.gantt_panels(dag, simulate(dag), 120, min_cols_per_action=5)
    text = "\n".join(p.plain for p in panels)
    for a in dag.actions:
        assert str(a) in text, str(a)


@pytest.fixture(scope="module")
def plan() -> plan_mod.Plan:
    prof = profile.load(UNIFORM)
    dag = dag_mod.build(schedules.generate("gpipe", 4, 8), prof)
    return plan_mod.make_plan(dag, solver.solve(dag, 0.9), [0.9] * 4, prof)


def _assert_cell_shows(cell: str, ratio: float) -> None:
    """A heat-map cell is '--' for no freezing, else the ratio to two decimals ('.65', '1.0')."""
    if cell == "--":
        assert ratio <= 0.0, ratio
    else:
        assert re.fullmatch(r"1\.0|\.\d\d", cell), cell
        assert abs(float(cell) - ratio) <= 0.005 + 1e-9, (cell, ratio)


def test_heat_map_shows_each_ratio(plan) -> None:
    text = plan_view.heat_map(plan, 120).plain
    lines = text.split("\n")
    assert lines[0] == "freeze ratio per (stage, micro-batch)"
    assert lines[1].split() == ["mb"] + [str(m) for m in range(8)]
    ratio = plan.ratio_of()
    shown = 0
    for s in range(4):
        cells = lines[2 + s].split()[2:]
        assert len(cells) == 8
        for m, cell in enumerate(cells):
            _assert_cell_shows(cell, ratio[f"{s}B{m}"])
            shown += cell != "--"
    assert shown == 32  # cap 0.9 on GPipe 4 x 8 freezes every backward a little or a lot


def test_heat_map_bins_micro_batches_when_narrow() -> None:
    prof = profile.load(UNIFORM)
    dag = dag_mod.build(schedules.generate("1f1b", 4, 64), prof)
    p = plan_mod.make_plan(dag, solver.solve(dag, 0.5), [0.5] * 4, prof)
    lines = plan_view.heat_map(p, 60).plain.split("\n")
    per_bin = -(-64 * 4 // 50)  # ceil: micro-batches per 4-column cell in 60 - 10 columns
    assert lines[0].endswith(f", {per_bin} micro-batches per column")
    starts = [int(x) for x in lines[1].split()[1:]]
    assert starts == list(range(0, 64, per_bin))
    ratio = p.ratio_of()
    for s in range(4):
        cells = lines[2 + s].split()[2:]
        for cell, b in zip(cells, starts):
            group = [ratio[f"{s}B{m}"] for m in range(b, min(64, b + per_bin))]
            _assert_cell_shows(cell, sum(group) / len(group))


def test_summary_and_headline() -> None:
    dag = _dag("1f1b", 4, 8)
    sim = simulate(dag)
    out = _render(render.summary_table(dag, sim, "profile toy"))
    assert "profile toy" in out
    for r in range(4):
        assert re.search(rf"^\s*{r}\s.*\b{r}\b.*24\.000.*9\.000.*72\.7%", out, re.M), out
    head = render.headline(dag, sim).plain
    assert "1f1b: 4 ranks, 4 stages, 8 micro-batches, 64 actions" in head
    assert "step time 33.000 ms, bubble fraction 27.3%" in head
    legend = render.legend({"F", "B"}).plain
    assert "forward" in legend and "full backward" in legend and "weight-grad" not in legend


def test_plan_tables(plan) -> None:
    out = _render(plan_view.plan_summary(plan))
    p = plan.predicted
    assert f"{p.no_freeze_ms:.3f}" in out and f"{p.planned_ms:.3f}" in out and f"{p.all_frozen_ms:.3f}" in out
    assert f"{p.speedup:.3f}x" in out
    out = _render(plan_view.stage_table(plan))
    for s, mean in enumerate(plan.mean_ratio_per_stage()):
        assert re.search(rf"^\s*{s}[\s\u2502]+{s}[\s\u2502]+0\.90[\s\u2502]+{mean:.3f}[\s\u2502]+100%", out, re.M), out


def test_grid_and_sweep_tables() -> None:
    sched = schedules.generate("zbv", 2, 3)
    rows = [[str(a) for a in r] for r in sched.order]
    out = _render(render.grid_table(rows, "zbv grid"), width=200)
    assert "zbv grid" in out
    for r, actions in enumerate(rows):
        line = next(line for line in out.split("\n") if re.match(rf"\s*{r}\s*\u2502", line))
        assert re.findall(r"\d+[FBIW]\d+", line) == actions
    # At 80 columns a schedule of 32 steps comes in windows of whole cells (one table blanked every cell).
    rows = [[str(a) for a in r] for r in schedules.generate("interleaved-1f1b", 4, 8).order]
    for width in (40, 80, 120):
        tables = render.grid_tables(rows, "grid", width)
        texts = [_render(t, width=width) for t in tables]
        assert all(len(line) <= width for text in texts for line in text.split("\n"))
        for r, actions in enumerate(rows):
            found = [a for text in texts for line in text.split("\n") if re.match(rf"\s*{r}\s*\u2502", line)
                     for a in re.findall(r"\d+[FBIW]\d+", line)]
            assert found == actions, (width, r)
    sweep_rows = sweep.sweep(str(UNIFORM), ["1f1b", "gpipe"], [2, 8], [0.5])
    out = _render(plan_view.sweep_table(sweep_rows, "what-if"), width=200)
    assert "n/a [1]" in out and "[1] schedule 1f1b needs at least" in out
    assert out.count("gpipe") == 2
    assert "*" not in out
    feasible = [dataclasses.replace(r, status="FEASIBLE") if r.schedule == "gpipe" else r for r in sweep_rows]
    out = _render(plan_view.sweep_table(feasible, "what-if"), width=200)
    assert out.count("x*") == 2 and "* feasible, not certified optimal" in out


def test_plan_title_says_when_a_plan_is_not_certified(plan) -> None:
    assert plan_view.plan_title(plan).endswith(f"solved by glop in {plan.solver.wall_s:.3f} s")
    phases = (*plan.solver.phases[:1], dataclasses.replace(plan.solver.phases[1], status="FEASIBLE", gap=0.25))
    record = dataclasses.replace(plan.solver, status="FEASIBLE", phases=phases)
    title = plan_view.plan_title(dataclasses.replace(plan, solver=record))
    assert title.endswith("s (FEASIBLE, not certified optimal: total_freeze gap 0.25)")
    assert "solved by" not in plan_view.plan_title(dataclasses.replace(plan, solver=None))


def test_gantt_panel_count_is_bounded_with_a_near_zero_action() -> None:
    dag = _dag("1f1b", 4, 8)
    durations = list(dag.d_max)
    durations[dag.actions.index(Action(0, "B", 0))] = 0.005  # 5 us in a 33 ms step
    panels = render.gantt_panels(dag, simulate(dag, durations), 120)
    assert len(panels) <= dag.num_nodes  # never more windows than actions to label


@settings(max_examples=40, deadline=None)
@given(name=st.sampled_from(["1f1b", "gpipe", "interleaved-zb", "zbv"]), m=st.integers(2, 12).map(lambda k: 2 * k),
       width=st.integers(12, 160), data=st.data())
def test_timeline_painters_property(name, m, width, data) -> None:
    # Any durations (some of no length, some far shorter than the rest), any span and width: painting only
    # render._painters' blocks leaves the text and colours of painting every action in node order.
    dag = _dag(name, 2 if name in ("interleaved-zb", "zbv") else 4, m)  # 4 stages: 2 per rank, or 1
    durations = data.draw(st.lists(st.sampled_from([0.0, 1e-6, 0.3, 1.0, 2.5, 7.0]), min_size=dag.num_nodes,
                                   max_size=dag.num_nodes))
    sim = simulate(dag, durations)
    # A span as gantt_panels cuts them (at least a 40th of the step, MAX_PANELS), or the whole step.
    a = data.draw(st.floats(0.0, 0.95))
    b = data.draw(st.floats(a + 1 / render.MAX_PANELS, 1.0 + 1 / render.MAX_PANELS))
    span = None if b > 1.0 else (a * sim.makespan_ms, b * sim.makespan_ms)
    fast = render.timeline(dag, sim, width, span)
    with pytest.MonkeyPatch.context() as patched:
        patched.setattr(render, "_painters", lambda d, *args: range(d.num_nodes))
        want = render.timeline(dag, sim, width, span)
    assert fast.plain == want.plain and _styles(fast) == _styles(want)


@pytest.mark.parametrize(("name", "p", "m", "width", "zeros"),
                         [("1f1b", 4, 300, 60, 0), ("interleaved-zb", 2, 64, 90, 0), ("dualpipev", 2, 40, 200, 0),
                          ("1f1b", 4, 8, 120, 0), ("1f1b", 4, 300, 60, 7), ("interleaved-zb", 2, 16, 150, 3)])
def test_timeline_paints_what_painting_every_action_paints(monkeypatch, name, p, m, width, zeros) -> None:
    # render._painters paints, per rank and column, only the block that paints it last (most blocks are
    # slivers at a million actions): the text and colours must be those of painting every action in order,
    # also where blocks of no length (every `zeros`-th action) sit between them.
    dag = _dag(name, p, m)
    durations = dag.durations(0.37)
    if zeros:
        durations = [0.0 if v % zeros == 1 else d for v, d in enumerate(durations)]
    sim = simulate(dag, durations)
    spans = [None, (0.0, sim.makespan_ms / 3), (sim.makespan_ms / 5, sim.makespan_ms / 2)]
    fast = [render.timeline(dag, sim, width, span) for span in spans]
    monkeypatch.setattr(render, "_painters", lambda d, *args: range(d.num_nodes))
    for span, got in zip(spans, fast):
        want = render.timeline(dag, sim, width, span)
        assert got.plain == want.plain and _styles(got) == _styles(want)
