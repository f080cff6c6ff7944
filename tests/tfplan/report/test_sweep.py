"""What-if sweeps: one row per combination, skipped rows with their reason, the uniform baseline at the plan's
mean ratio, CSV and plot output."""

from __future__ import annotations

import csv
import dataclasses
import io

import pytest

from tests.conftest import PROFILES
from tfplan.cost import profile
from tfplan.errors import TfplanError
from tfplan.plan import job
from tfplan.report import sweep
from tfplan.schedule import schedules
from tfplan.solve import lp
from tfplan.step import dag as dag_mod
from tfplan.step.simulate import simulate

UNIFORM = str(PROFILES / "toy-uniform-4.json")
HETERO = str(PROFILES / "toy-hetero-4.json")
NAMES = ["gpipe", "1f1b", "interleaved-1f1b", "dualpipev"]
MBS = [2, 3, 8]
CAPS = [0.3, 0.9]


@pytest.fixture(scope="module")
def rows() -> list[sweep.SweepRow]:
    return sweep.sweep(HETERO, NAMES, MBS, CAPS)


def test_one_row_per_combination_in_order(rows) -> None:
    assert [(r.schedule, r.num_microbatches, r.cap) for r in rows] == [
        (n, m, c) for n in NAMES for m in MBS for c in CAPS
    ]


def test_skipped_rows_carry_the_reason(rows) -> None:
    skipped = {(r.schedule, r.num_microbatches): r.skipped for r in rows if r.skipped}
    # toy-hetero-4 has 4 stages: 1f1b runs on 4 ranks (needs M >= 4); dualpipev on 2 ranks (needs M >= 4).
    assert set(skipped) == {("1f1b", 2), ("1f1b", 3), ("dualpipev", 2), ("dualpipev", 3)}
    assert skipped[("1f1b", 2)] == "schedule 1f1b needs at least as many micro-batches as ranks (4), got 2"
    assert "dualpipev needs at least as many micro-batches as stages (4), got 3" in skipped[("dualpipev", 3)]
    for r in rows:
        if r.skipped:
            assert "\n" not in r.skipped
            assert r.planned_ms is None and r.speedup is None and r.num_ranks is None


def test_rows_match_an_independent_solve(rows) -> None:
    prof = profile.load(HETERO)
    for r in rows:
        if r.skipped:
            continue
        v = 2 if r.schedule in ("interleaved-1f1b", "dualpipev") else 1
        sched = schedules.generate(r.schedule, 4 // v, r.num_microbatches, v)
        assert (r.num_ranks, r.num_stages) == (sched.num_ranks, sched.num_stages)
        dag = dag_mod.build(sched, prof)
        sol = job.solve_dag(dag, r.cap, backend="glop")  # with the stage-0 anchor, as the sweep solves
        none = simulate(dag)
        planned = simulate(dag, sol.durations)
        assert r.no_freeze_ms == none.batch_time_ms
        assert r.planned_ms == pytest.approx(planned.batch_time_ms, rel=1e-12)
        assert r.speedup == pytest.approx(none.batch_time_ms / planned.batch_time_ms, rel=1e-12)
        assert r.bubble_before == none.bubble_fraction
        assert r.bubble_after == pytest.approx(planned.bubble_fraction, rel=1e-9)
        assert r.all_frozen_ms == simulate(dag, dag.d_min).batch_time_ms
        # Uniform baseline: every freezable action at the plan's mean ratio.
        nodes = [v for g in dag.freeze_groups() for v in g]
        mean = sum(sol.ratios[v] for v in nodes) / len(nodes)
        assert r.mean_freeze_ratio == pytest.approx(mean, abs=1e-12)
        assert r.mean_freeze_ratio <= r.cap + 1e-7
        assert r.uniform_ms == pytest.approx(simulate(dag, dag.durations(r.mean_freeze_ratio)).batch_time_ms, rel=1e-12)
        assert r.uniform_speedup == pytest.approx(r.no_freeze_ms / r.uniform_ms, rel=1e-12)
        assert r.planned_ms <= r.uniform_ms * (1 + 1e-8)
        assert r.solve_s >= 0


def test_larger_cap_is_never_slower(rows) -> None:
    by_key = {(r.schedule, r.num_microbatches, r.cap): r for r in rows if not r.skipped}
    for (name, m, cap), r in by_key.items():
        if cap == 0.3:
            assert by_key[(name, m, 0.9)].planned_ms <= r.planned_ms * (1 + 1e-8)


def test_on_row_is_called_once_per_row() -> None:
    seen = []
    rows = sweep.sweep(UNIFORM, ["1f1b", "gpipe"], [3, 4], [0.5], on_row=seen.append)
    assert seen == rows and len(rows) == 4


def test_unknown_schedule_and_bad_caps_fail_before_solving() -> None:
    seen = []
    with pytest.raises(TfplanError, match="unknown schedule 'nope'"):
        sweep.sweep(UNIFORM, ["gpipe", "nope"], [4], [0.5])
    with pytest.raises(TfplanError, match=r"must be in \[0, 1\], got 1\.5"):
        sweep.sweep(UNIFORM, ["gpipe"], [4], [0.5, 1.5], on_row=seen.append)
    assert seen == []
    with pytest.raises(TfplanError, match="profile not found"):
        sweep.sweep(str(PROFILES / "missing.json"), ["gpipe"], [4], [0.5])
    with pytest.raises(TfplanError, match="--solver must be one of auto, glop, fastlp, got 'simplex'"):
        sweep.sweep(UNIFORM, ["gpipe"], [4], [0.5], on_row=seen.append, backend="simplex")
    assert seen == []


def test_fastlp_backend_gives_the_same_rows() -> None:
    args = (HETERO, ["1f1b", "interleaved-1f1b"], [16, 32], [0.3, 0.9])
    glop, fast = sweep.sweep(*args, backend="glop"), sweep.sweep(*args, backend="fastlp")
    for a, b in zip(glop, fast, strict=True):
        assert (a.schedule, a.num_microbatches, a.cap, a.skipped) == (b.schedule, b.num_microbatches, b.cap, b.skipped)
        if not a.skipped:
            assert (a.status, b.status) == ("OPTIMAL", "OPTIMAL")
            assert b.planned_ms == pytest.approx(a.planned_ms, rel=1e-9)
            assert b.mean_freeze_ratio == pytest.approx(a.mean_freeze_ratio, rel=1e-6, abs=1e-9)


def test_csv_has_a_header_and_one_row_per_combination(rows) -> None:
    text = sweep.to_csv(rows)
    lines = text.splitlines()
    header = [f.name for f in dataclasses.fields(sweep.SweepRow)]
    assert lines[0].split(",") == header
    assert len(lines) == 1 + len(NAMES) * len(MBS) * len(CAPS)
    parsed = list(csv.DictReader(io.StringIO(text)))
    assert [(p["schedule"], int(p["num_microbatches"]), float(p["cap"])) for p in parsed] == [
        (r.schedule, r.num_microbatches, r.cap) for r in rows
    ]
    for p, r in zip(parsed, rows):
        assert p["skipped"] == r.skipped
        if not r.skipped:
            assert float(p["planned_ms"]) == r.planned_ms  # full precision
            assert float(p["uniform_ms"]) == r.uniform_ms


def test_plot_writes_a_png(tmp_path, rows) -> None:
    pytest.importorskip("matplotlib")
    path = tmp_path / "sweep.png"
    sweep.plot(rows, str(path))
    assert path.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    assert [p.name for p in tmp_path.iterdir()] == ["sweep.png"]


def test_a_solve_out_of_time_is_a_skipped_row(monkeypatch) -> None:
    # --time-limit applies per solve; a combination without a feasible plan within it is listed with the reason.
    def out_of_time(dag, caps, target=None, backend="auto", time_limit_s=None):
        assert time_limit_s == 7.5
        raise lp.TimeLimitReached("--time-limit: no feasible plan within 7.5 s (fastlp); raise the limit")

    monkeypatch.setattr(sweep, "solve_dag", out_of_time)
    rows = sweep.sweep(UNIFORM, ["1f1b"], [4], [0.5, 0.9], time_limit_s=7.5)
    assert [r.skipped for r in rows] == ["--time-limit: no feasible plan within 7.5 s (fastlp); raise the limit"] * 2
    with pytest.raises(TfplanError, match="--time-limit: must be a positive number of seconds"):
        sweep.sweep(UNIFORM, ["1f1b"], [4], [0.5], time_limit_s=-1.0)


def test_with_a_noise_scale_every_row_says_what_freezing_is_worth_in_learning(tmp_path):
    import json

    from tfplan.cost import profile as profile_mod
    from tfplan.report.sweep import sweep, to_csv

    path = tmp_path / "p.json"
    prof = profile_mod.uniform(2, forward_ms=10.0, backward_ms=20.0, backward_frozen_ms=10.0)
    path.write_text(json.dumps(prof.to_dict() | {"source": {"kind": "hand", "microbatch_size": 2, "seq_len": 64}}))
    rows = sweep(str(path), ["1f1b"], [4, 16], [0.5, 0.9], noise_scale=[1000.0])
    for r in rows:
        assert r.batch_tokens == r.num_microbatches * 128
        # freezing costs learning (efficiency < 1), and the goodput plan is at least as good as the makespan
        # plan and as no freezing (a plan too)
        assert r.goodput < r.speedup and r.best_goodput >= max(1.0, r.goodput) - 1e-9
    assert "best_goodput" in to_csv(rows).splitlines()[0]
    # without noise a plan's goodput is its speedup, and the best is the fastest plan's
    for r in sweep(str(path), ["1f1b"], [4], [0.5, 0.9], noise_scale=[0.0]):
        assert r.goodput == pytest.approx(r.speedup) and r.best_goodput == pytest.approx(r.speedup)
    bare = tmp_path / "bare.json"
    bare.write_text(json.dumps(prof.to_dict()))
    with pytest.raises(TfplanError, match=r"^--noise-scale: profile 'uniform' does not say its micro-batch shape"):
        sweep(str(bare), ["1f1b"], [4], [0.5], noise_scale=[1000.0])
