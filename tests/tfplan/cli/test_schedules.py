"""`tfplan simulate`, `tfplan schedules`, `tfplan show-schedule` (tfplan.cli.schedules): outputs for people and for
scripts, traces and Gantt charts, freeze ratios, and named and custom schedule CSVs."""

from __future__ import annotations

import json
import re

import pytest

from tests.conftest import ROOT
from tests.tfplan.cli.runner import HETERO, TOY, UNIFORM, ok
from tfplan.cost import profile
from tfplan.schedule import schedules
from tfplan.schedule.actions import Action
from tfplan.step import dag as dag_mod
from tfplan.step.simulate import simulate


def _rank_rows(text: str) -> list[str]:
    return [line for line in text.split("\n") if re.match(r"rank \d+ ", line)]


def test_simulate_default_output() -> None:
    out = ok("simulate", *TOY).stdout
    assert "1f1b: 4 ranks, 4 stages, 8 micro-batches, 64 actions" in out
    assert "step time 33.000 ms, bubble fraction 27.3%" in out
    assert "profile toy-uniform-4" in out
    assert len(re.findall(r"24\.000.*9\.000.*72\.7%", out)) == 4  # per-rank utilisation
    rows = _rank_rows(out)
    assert len(rows) == 4
    for row in rows:  # readable timeline: every micro-batch number for F and B, on every rank
        assert {f"{k}{m}" for k, m in re.findall(r"([FB])(\d+)", row[8:])} == {
            f"{k}{m}" for k in "FB" for m in range(8)
        }
        assert len(row) <= 120


def test_simulate_json() -> None:
    data = json.loads(ok("simulate", *TOY, "--json").stdout)
    assert data["batch_time_ms"] == 33.0
    assert data["bubble_fraction"] == pytest.approx(3 / 11)
    assert (data["num_ranks"], data["num_stages"], data["num_microbatches"]) == (4, 4, 8)
    assert data["busy_ms"] == [24.0] * 4
    assert data["idle_ms"] == [9.0] * 4
    assert data["schedule"] == "1f1b" and data["freeze_ratio"] == 0.0
    # The critical path runs from the first forward to the last backward.
    assert data["critical_path"][0] == "0F0" and data["critical_path"][-1] == "0B7"


def test_simulate_hetero_json_matches_library() -> None:
    data = json.loads(ok("simulate", "-p", HETERO, "-s", "zbv", "-m", "5", "--json").stdout)
    prof = profile.load(HETERO)
    sim = simulate(dag_mod.build(schedules.generate("zbv", 2, 5), prof))
    assert data["batch_time_ms"] == sim.batch_time_ms
    assert data["busy_ms"] == sim.busy_ms and data["idle_ms"] == sim.idle_ms
    assert (data["num_ranks"], data["num_stages"], data["stages_per_rank"]) == (2, 4, 2)


def test_simulate_trace(tmp_path) -> None:
    path = tmp_path / "trace.json"
    out = ok("simulate", *TOY, "--trace", path).stdout
    assert "trace written to" in out
    trace = json.loads(path.read_text())
    events = trace["traceEvents"]
    xs = [e for e in events if e["ph"] == "X"]
    assert len(xs) == 64
    assert {e["tid"] for e in xs} == {0, 1, 2, 3}
    assert {e["pid"] for e in events} == {0}
    names = {e["tid"]: e["args"]["name"] for e in events if e["ph"] == "M" and e["name"] == "thread_name"}
    assert names == {r: f"rank {r}" for r in range(4)}
    for e in xs:
        assert e["ts"] >= 0 and e["dur"] == {"F": 1000.0, "B": 2000.0}[e["cat"]]  # microseconds
        assert int(e["name"][0]) == e["tid"]
    # Events on one rank never overlap, and the last one ends at the makespan.
    for r in range(4):
        mine = sorted((e["ts"], e["ts"] + e["dur"]) for e in xs if e["tid"] == r)
        assert all(a[1] <= b[0] + 1e-6 for a, b in zip(mine, mine[1:]))
    assert max(e["ts"] + e["dur"] for e in xs) == pytest.approx(33_000.0)


def test_simulate_gantt_labels_every_action() -> None:
    out = ok("simulate", "-p", HETERO, "-s", "1f1b", "-m", "8", "--gantt").stdout
    rows = _rank_rows(out)
    assert len(rows) > 4 and len(rows) % 4 == 0  # several windows of 4 ranks
    for r in range(4):
        tokens = {f"{k}{m}" for row in rows[r::4] for k, m in re.findall(r"([FB])(\d+)", row[8:])}
        assert tokens == {f"{k}{m}" for k in "FB" for m in range(8)}


@pytest.mark.parametrize("ratio", [0.5, 1.0])
def test_simulate_freeze_ratio(ratio: float) -> None:
    data = json.loads(ok("simulate", *TOY, "--freeze-ratio", ratio, "--json").stdout)
    dag = dag_mod.build(schedules.generate("1f1b", 4, 8), profile.load(UNIFORM))
    assert data["batch_time_ms"] == simulate(dag, dag.durations(ratio)).batch_time_ms
    assert data["freeze_ratio"] == ratio
    if ratio == 1.0:
        assert data["batch_time_ms"] == 22.0
    out = ok("simulate", *TOY, "--freeze-ratio", ratio).stdout
    assert f"every B/W action frozen at ratio {ratio:g}" in out


def test_simulate_schedule_csv_round_trip(tmp_path) -> None:
    csv_path = tmp_path / "zb.csv"
    ok("show-schedule", "-s", "interleaved-zb", "--ranks", 2, "-m", 4, "--csv", csv_path)
    named = json.loads(ok("simulate", "-p", UNIFORM, "-s", "interleaved-zb", "-m", 4, "--json").stdout)
    custom = json.loads(ok("simulate", "-p", UNIFORM, "--schedule-csv", csv_path, "--json").stdout)
    assert custom["schedule"] == "custom"
    assert custom["batch_time_ms"] == named["batch_time_ms"]
    assert custom["busy_ms"] == named["busy_ms"]


def test_simulate_custom_schedule_csv(tmp_path) -> None:
    # 1F1B whose last rank runs two warm-up forwards instead of one: valid, and slower (it waits for F1).
    order = [list(r) for r in schedules.generate("1f1b", 4, 8).order]
    order[3] = [Action(3, a.kind, a.mb) for a in order[2]]
    csv_path = tmp_path / "custom.csv"
    csv_path.write_text("\n".join(",".join(str(a) for a in rank) for rank in order) + "\n")
    data = json.loads(ok("simulate", "-p", UNIFORM, "--schedule-csv", csv_path, "-m", 8, "--json").stdout)
    expected = simulate(dag_mod.build(schedules.from_order(order), profile.load(UNIFORM)))
    assert data["batch_time_ms"] == expected.batch_time_ms
    assert data["busy_ms"] == expected.busy_ms
    assert data["batch_time_ms"] == 51.0  # not plain 1F1B's 33


def test_schedules_list() -> None:
    out = ok("schedules").stdout
    for name in schedules.SCHEDULES:
        assert name in out
    rows = json.loads(ok("schedules", "--json").stdout)
    assert [r["name"] for r in rows] == list(schedules.SCHEDULES)
    assert all(r["description"] and r["torch_class"] for r in rows)


def test_show_schedule_grid_and_csv(tmp_path) -> None:
    path = tmp_path / "s.csv"
    out = ok("show-schedule", "--schedule", "interleaved-1f1b", "--ranks", 4, "-m", 8, "--csv", path).stdout
    expected = schedules.generate("interleaved-1f1b", 4, 8, 2)
    assert path.read_text() == schedules.to_csv(expected)
    assert path.read_text() == (ROOT / "tests" / "golden" / "interleaved-1f1b-P4-V2-M8.csv").read_text()
    assert "interleaved-1f1b: 4 ranks, 8 stages, 8 micro-batches" in out
    data = json.loads(ok("show-schedule", "-s", "dualpipev", "--ranks", 2, "-m", 4, "--json").stdout)
    assert data["order"] == [[str(a) for a in r] for r in schedules.generate("dualpipev", 2, 4).order]
