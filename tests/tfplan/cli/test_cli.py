"""The `tfplan` command line, driven through typer's CliRunner: outputs for people and for scripts, files
written, and bad input (exit 1, one `error:` line on stderr, no traceback, no file written; usage errors 2)."""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys

import pytest
from typer.testing import CliRunner

from tests.conftest import PROFILES, ROOT
from tfplan.cli.app import app
from tfplan.cost import profile
from tfplan.plan import plan as plan_mod
from tfplan.schedule import schedules
from tfplan.schedule.actions import Action
from tfplan.step import dag as dag_mod
from tfplan.step.simulate import simulate

UNIFORM = str(PROFILES / "toy-uniform-4.json")
HETERO = str(PROFILES / "toy-hetero-4.json")
TOY = ["--profile", UNIFORM, "--schedule", "1f1b", "--microbatches", "8"]


def run(*args: str):
    result = CliRunner().invoke(app, [str(a) for a in args])
    assert "Traceback" not in result.stdout + result.stderr
    if result.exit_code == 0:
        assert result.exception is None, result.exception
    else:  # a clean exit (typer.Exit), not an exception escaping the command
        assert isinstance(result.exception, SystemExit), repr(result.exception)
    return result


def ok(*args: str):
    result = run(*args)
    assert result.exit_code == 0, result.stdout + result.stderr
    return result


def _rank_rows(text: str) -> list[str]:
    return [line for line in text.split("\n") if re.match(r"rank \d+ ", line)]


# ---------------------------------------------------------------------------------------------------------
# simulate


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


# ---------------------------------------------------------------------------------------------------------
# solve, show, whatif


def test_solve_json() -> None:
    data = json.loads(ok("solve", *TOY, "--json").stdout)
    assert data["no_freeze_ms"] == 33.0
    assert data["planned_ms"] == pytest.approx(22.8, rel=1e-8)
    assert data["all_frozen_ms"] == 22.0
    assert data["speedup"] == pytest.approx(33.0 / data["planned_ms"], rel=1e-12)
    assert len(data["mean_freeze_ratio"]) == 4
    assert all(r <= 0.9 + 1e-7 for r in data["mean_freeze_ratio"])
    assert sum(data["mean_freeze_ratio"]) == pytest.approx(3.1, abs=1e-6)  # METHOD.md: minimal freezing
    assert data["output"] is None


@pytest.mark.parametrize(
    "name, m, auto", [("1f1b", 256, "glop"), ("interleaved-1f1b", 64, "glop"), ("1f1b", 320, "fastlp")]
)
def test_solve_backends_agree(name: str, m: int, auto: str) -> None:
    """--solver glop and fastlp give the same plan (and phase values); auto picks by size (AUTO_FASTLP_ACTIONS)."""
    from tfplan.plan.job import AUTO_FASTLP_ACTIONS

    actions = schedules.generate(name, 4 if name == "1f1b" else 2, m).num_actions
    assert (actions > AUTO_FASTLP_ACTIONS) == (auto == "fastlp")
    base = ["solve", "-p", HETERO, "-s", name, "-m", str(m), "--json"]
    got = {b: json.loads(ok(*base, "--solver", b).stdout) for b in ("glop", "fastlp", "auto")}
    assert [got[b]["solver"]["backend"] for b in ("glop", "fastlp", "auto")] == ["glop", "fastlp", auto]
    for b in ("fastlp", "auto"):
        assert got[b]["planned_ms"] == pytest.approx(got["glop"]["planned_ms"], rel=1e-9)
        total = sum(got[b]["mean_freeze_ratio"])
        assert total == pytest.approx(sum(got["glop"]["mean_freeze_ratio"]), rel=1e-6)
        phases = [p["objective"] for p in got[b]["solver"]["phases"]]
        assert phases == pytest.approx([p["objective"] for p in got["glop"]["solver"]["phases"]], rel=1e-6)


def test_solve_stage0_anchor_flag(tmp_path) -> None:
    """GPipe on uniform costs at cap 0.9: every stage-0 backward is on the last chain. By default one stays
    unfrozen (tfplan.plan.job Note [stage-0 anchor]); --no-stage0-anchor spreads the cap over all of them."""
    plans = []
    for flag in ([], ["--no-stage0-anchor"]):
        path = tmp_path / f"plan{len(plans)}.json"
        ok("solve", "-p", UNIFORM, "-s", "gpipe", "-m", "4", "-o", path, *flag)
        plans.append(plan_mod.load(path))
    stage0 = [[p.ratios[v] for v in p.dag.freeze_groups()[0]] for p in plans]
    assert min(stage0[0]) == 0.0 and min(stage0[1]) > 0.0
    assert sum(stage0[0]) / 4 <= 0.9 + 1e-7
    assert plans[0].predicted.planned_ms >= plans[1].predicted.planned_ms


def test_solve_per_stage_caps() -> None:
    data = json.loads(ok("solve", *TOY, "-c", "0,0.5,0.9,1", "--json").stdout)
    assert data["max_freeze_ratio"] == [0.0, 0.5, 0.9, 1.0]
    assert data["mean_freeze_ratio"][0] == 0.0
    assert data["mean_freeze_ratio"][1] <= 0.5 + 1e-7


def test_solve_writes_plan_and_csv_then_show(tmp_path) -> None:
    path = tmp_path / "plan.json"
    out = ok("solve", "-p", HETERO, "-s", "1f1b", "-m", 8, "-o", path).stdout
    assert f"plan written to {path}, schedule CSV to {tmp_path / 'plan.csv'}" in out.replace("\n", "")
    assert "TimelyFreeze plan" in out and "freeze ratio per (stage, micro-batch)" in out
    assert "before: no freezing" in out and "after: TimelyFreeze plan" in out
    plan = plan_mod.load(path)
    assert (tmp_path / "plan.csv").read_text() == schedules.to_csv(plan.schedule)

    shown = ok("show", path).stdout
    assert "TimelyFreeze plan" in shown and f"{plan.predicted.planned_ms:.3f}" in shown
    data = json.loads(ok("show", path, "--json").stdout)
    assert data["planned_ms"] == plan.predicted.planned_ms
    assert data["speedup"] == plan.predicted.speedup

    trace_path = tmp_path / "trace.json"
    ok("show", path, "--trace", trace_path)
    xs = [e for e in json.loads(trace_path.read_text())["traceEvents"] if e["ph"] == "X"]
    assert len(xs) == plan.dag.num_nodes
    assert {e["tid"] for e in xs} == {0, 1, 2, 3}
    ratio = plan.ratio_of()
    for e in xs:
        if e["cat"] == "B":
            assert e["args"]["freeze_ratio"] == ratio[e["name"]]
    assert max(e["ts"] + e["dur"] for e in xs) == pytest.approx(plan.predicted.planned_ms * 1000, rel=1e-9)


def test_solve_schedule_csv_equals_named(tmp_path) -> None:
    csv_path = tmp_path / "s.csv"
    ok("show-schedule", "-s", "dualpipev", "--ranks", 2, "-m", 5, "--csv", csv_path)
    named = json.loads(ok("solve", "-p", HETERO, "-s", "dualpipev", "-m", 5, "-c", "0.6", "--json").stdout)
    custom = json.loads(ok("solve", "-p", HETERO, "--schedule-csv", csv_path, "-c", "0.6", "--json").stdout)
    assert custom["schedule"] == "custom"
    for key in ("no_freeze_ms", "planned_ms", "all_frozen_ms", "mean_freeze_ratio"):
        assert custom[key] == named[key], key


def test_solve_json_with_output(tmp_path) -> None:
    path = tmp_path / "p.json"
    data = json.loads(ok("solve", *TOY, "-o", path, "--json").stdout)
    assert data["output"] == str(path) and data["schedule_csv"] == str(tmp_path / "p.csv")
    assert path.exists()


def test_whatif_csv_plot_json(tmp_path) -> None:
    csv_path, png = tmp_path / "w.csv", tmp_path / "w.png"
    args = ["whatif", "-p", UNIFORM, "--schedules", "1f1b,gpipe", "-m", "2,8", "--caps", "0.5,0.9"]
    rows = json.loads(ok(*args, "--csv", csv_path, "--plot", png, "--json").stdout)
    assert [(r["schedule"], r["num_microbatches"], r["cap"]) for r in rows] == [
        (n, m, c) for n in ("1f1b", "gpipe") for m in (2, 8) for c in (0.5, 0.9)
    ]
    assert [bool(r["skipped"]) for r in rows] == [True, True] + [False] * 6
    assert rows[3]["planned_ms"] == pytest.approx(22.8, rel=1e-8)
    lines = csv_path.read_text().splitlines()
    assert lines[0].startswith("schedule,num_microbatches,cap,") and len(lines) == 9
    assert png.read_bytes()[:4] == b"\x89PNG"
    out = ok(*args).stdout
    assert "1.447x" in out and "n/a" in out


def test_target_speedup_reachable() -> None:
    data = json.loads(ok("solve", *TOY, "--target-speedup", "1.2", "--json").stdout)
    assert data["speedup"] == pytest.approx(1.2, rel=1e-6)
    assert data["planned_ms"] == pytest.approx(27.5, rel=1e-6)
    fastest = json.loads(ok("solve", *TOY, "--json").stdout)
    assert sum(data["mean_freeze_ratio"]) < sum(fastest["mean_freeze_ratio"])


@pytest.mark.parametrize(
    ("target", "message"),
    [
        ("1.49", r"^error: --target-speedup 1\.49 is unreachable under the caps; the best they allow is 1\.447x"),
        ("1.6", r"^error: --target-speedup 1\.6 is unreachable: even with everything frozen .* 1\.5x"),
        ("0.5", r"^error: --target-speedup must be >= 1, got 0\.5"),
    ],
)
def test_target_speedup_unreachable(tmp_path, target: str, message: str) -> None:
    result = run("solve", *TOY, "--target-speedup", target, "-o", tmp_path / "plan.json")
    assert result.exit_code == 1
    assert re.search(message, result.stderr), result.stderr
    assert list(tmp_path.iterdir()) == []


# ---------------------------------------------------------------------------------------------------------
# Bad input: exit 1, one "error:" line on stderr, no traceback, no file written


def _bad_inputs(tmp) -> list[tuple[str, list, str]]:
    invalid_json = tmp / "in" / "invalid.json"
    schema = tmp / "in" / "schema.json"
    three = tmp / "in" / "three.csv"
    three.write_text(schedules.to_csv(schedules.generate("gpipe", 3, 4)))
    invalid_json.write_text('{"schema_version": 1,')
    bad = json.loads((PROFILES / "toy-uniform-4.json").read_text())
    bad["stages"][2]["backward_ms"] = -1
    schema.write_text(json.dumps(bad))
    out = tmp / "out"
    trace, plan, csv_out, png = out / "t.json", out / "plan.json", out / "w.csv", out / "w.png"
    sim = ["simulate", "--trace", trace]
    solve = ["solve", "-o", plan]
    whatif = ["whatif", "--csv", csv_out, "--plot", png]
    return [
        ("missing profile", [*sim, "-p", tmp / "none.json", "-s", "1f1b", "-m", 8], "profile not found"),
        ("invalid JSON", [*solve, "-p", invalid_json, "-s", "1f1b", "-m", 8], "invalid JSON at line 1, column 22"),
        ("schema", [*sim, "-p", schema, "-s", "1f1b", "-m", 8], r"stages\[2\]\.backward_ms: must be >= 0"),
        ("schema whatif", [*whatif, "-p", schema], r"stages\[2\]\.backward_ms"),
        ("unknown schedule", [*sim, "-p", UNIFORM, "-s", "zigzag", "-m", 8], "unknown schedule 'zigzag'"),
        ("unknown schedule solve", [*solve, "-p", UNIFORM, "-s", "zigzag", "-m", 8], "unknown schedule"),
        ("unknown schedule whatif", [*whatif, "-p", UNIFORM, "--schedules", "1f1b,zigzag"], "unknown schedule"),
        ("1f1b M < P", [*sim, "-p", UNIFORM, "-s", "1f1b", "-m", 3], r"1f1b needs at least .* ranks \(4\), got 3"),
        (
            "interleaved rounds",
            [*solve, "-p", UNIFORM, "-s", "interleaved-1f1b", "-m", 5],
            r"multiple of the rounds max\(1, M // P\) = 2 .* got M = 5 with P = 2",
        ),
        ("dualpipev M < 2P", [*sim, "-p", UNIFORM, "-s", "dualpipev", "-m", 3], r"dualpipev needs .* \(4\), got 3"),
        ("stages per rank", [*sim, "-p", UNIFORM, "-s", "gpipe", "-m", 4, "--stages-per-rank", 2], "exactly 1"),
        ("V does not divide", [*solve, "-p", UNIFORM, "-s", "looped-bfs", "-m", 4, "--stages-per-rank", 3], "divide"),
        ("ranks mismatch", [*sim, "-p", UNIFORM, "-s", "1f1b", "-m", 8, "--ranks", 3], r"--ranks 3 x 1 .* has 4"),
        ("csv stage count", [*solve, "-p", UNIFORM, "--schedule-csv", three], "has 4 stages but the schedule has 3"),
        ("cap above 1", [*solve, "-p", UNIFORM, "-s", "1f1b", "-m", 8, "-c", "1.5"], r"must be in \[0, 1\], got 1.5"),
        (
            "cap below 0",
            [*solve, "-p", UNIFORM, "-s", "1f1b", "-m", 8, "--max-freeze-ratio=-0.2"],
            r"must be in \[0, 1\], got -0.2",
        ),
        ("cap not a number", [*solve, "-p", UNIFORM, "-s", "1f1b", "-m", 8, "-c", "high"], "expected numbers"),
        ("caps per stage", [*solve, *TOY, "-c", "0.9,0.9,0.9"], "got 3 per-stage caps but the schedule has 4"),
        ("whatif caps", [*whatif, "-p", UNIFORM, "--caps", "0.5,2"], r"must be in \[0, 1\], got 2"),
        ("target above all-frozen", [*solve, *TOY, "--target-speedup", "3"], "unreachable"),
        ("freeze ratio", [*sim, *TOY, "--freeze-ratio", "1.5"], r"--freeze-ratio must be in \[0, 1\]"),
        ("neither schedule nor csv", [*sim, "-p", UNIFORM, "-m", 8], "give exactly one of --schedule"),
        ("missing csv", [*sim, "-p", UNIFORM, "--schedule-csv", tmp / "none.csv"], "schedule CSV not found"),
        ("show-schedule", ["show-schedule", "-s", "1f1b", "--ranks", 4, "-m", 2, "--csv", csv_out], "1f1b needs"),
        ("show missing plan", ["show", tmp / "none.json", "--trace", trace], "plan not found"),
        ("time limit zero", [*solve, *TOY, "--time-limit", 0], "--time-limit: must be a positive number of seconds"),
        ("whatif time limit", [*whatif, "-p", UNIFORM, "--time-limit", -1], "--time-limit: must be a positive"),
        (
            "time limit reached",
            [*solve, "-p", UNIFORM, "-s", "1f1b", "-m", 1024, "--solver", "fastlp", "--time-limit", 0.001],
            r"--time-limit: no feasible plan within 0\.001 s \(fastlp\)",
        ),
        ("show solver section", ["show", _plan_lacking(tmp, "lp_makespan_ms")], r"solver\.lp_makespan_ms: missing"),
    ]


def _plan_lacking(tmp, key: str):
    """A plan file whose solver section lacks `key` (before issue 9, `tfplan show` died of a KeyError)."""
    path = tmp / "in" / "plan.json"
    ok("solve", *TOY, "-o", path)
    obj = json.loads(path.read_text())
    del obj["solver"][key]
    path.write_text(json.dumps(obj))
    return path


def test_bad_input_cases_are_all_distinct(tmp_path) -> None:
    (tmp_path / "in").mkdir()
    ids = [c[0] for c in _bad_inputs(tmp_path)]
    assert len(ids) == len(set(ids)) == len(BAD_IDS)


BAD_IDS = [
    "missing profile",
    "invalid JSON",
    "schema",
    "schema whatif",
    "unknown schedule",
    "unknown schedule solve",
    "unknown schedule whatif",
    "1f1b M < P",
    "interleaved rounds",
    "dualpipev M < 2P",
    "stages per rank",
    "V does not divide",
    "ranks mismatch",
    "csv stage count",
    "cap above 1",
    "cap below 0",
    "cap not a number",
    "caps per stage",
    "whatif caps",
    "target above all-frozen",
    "freeze ratio",
    "neither schedule nor csv",
    "missing csv",
    "show-schedule",
    "show missing plan",
    "time limit zero",
    "whatif time limit",
    "time limit reached",
    "show solver section",
]


@pytest.mark.parametrize(
    "case",
    BAD_IDS,
)
def test_bad_input(tmp_path, case: str) -> None:
    (tmp_path / "in").mkdir()
    (tmp_path / "out").mkdir()
    args, message = next((a, m) for name, a, m in _bad_inputs(tmp_path) if name == case)
    result = run(*args)
    assert result.exit_code == 1, result.stdout + result.stderr
    err = result.stderr
    assert err.startswith("error: "), err
    assert err.count("\n") == 1, f"one line expected, got {err!r}"
    assert re.search(message, err), err
    assert result.stdout == ""
    assert list((tmp_path / "out").iterdir()) == []


def test_whatif_errors_apart_from_the_blank_line(tmp_path) -> None:
    # The same two whatif cases as above, checked for everything but the leading blank line.
    for caps, message in (("0.5,2", r"must be in \[0, 1\], got 2"), ("0.5", None)):
        profile_path = PROFILES / "missing.json" if message is None else UNIFORM
        result = run("whatif", "-p", profile_path, "--caps", caps, "--csv", tmp_path / "w.csv")
        assert result.exit_code == 1
        err = result.stderr.lstrip("\n")
        assert err.startswith("error: ") and err.count("\n") == 1, err
        assert re.search(message or "profile not found", err)
    assert list(tmp_path.iterdir()) == []


def test_whatif_bad_cap_names_the_caps_option() -> None:
    result = run("whatif", "-p", UNIFORM, "--caps", "0.5,2")
    assert result.exit_code == 1
    err = result.stderr.strip()
    assert err.startswith("error: --caps") and "stage" not in err, err


@pytest.mark.parametrize(
    "args",
    [
        ["solve", *TOY, "-o", "{out}/plan.json"],
        ["simulate", *TOY, "--trace", "{out}/plan.json"],
        ["show-schedule", "-s", "1f1b", "--ranks", "4", "-m", "8", "--csv", "{out}/plan.json"],
    ],
    ids=["solve", "simulate", "show-schedule"],
)
def test_output_path_that_is_a_folder(tmp_path, args) -> None:
    (tmp_path / "plan.json").mkdir()  # the output path exists and is a folder
    result = CliRunner().invoke(app, [a.format(out=tmp_path) for a in args])
    assert result.exit_code == 1
    assert result.stderr.startswith("error: ") and result.stderr.count("\n") == 1, result.stderr
    assert sorted(p.name for p in tmp_path.iterdir()) == ["plan.json"]  # nothing else written


def test_whatif_json_is_strict_json() -> None:
    out = ok("whatif", "-p", UNIFORM, "--schedules", "1f1b", "-m", "2,4", "--caps", "0.5", "--json").stdout

    def reject(constant: str):
        raise ValueError(f"{constant} is not JSON")

    rows = json.loads(out, parse_constant=reject)
    assert rows[0]["skipped"] and rows[0]["planned_ms"] is None


def test_invalid_custom_schedule_shows_the_grid(tmp_path) -> None:
    path = tmp_path / "bad.csv"
    path.write_text("0F0,0B0,0F1,0B1\n1F1,1F0,1B0,1B1\n")  # rank 1 receives micro-batches out of order
    prof = tmp_path / "two.json"
    prof.write_text(json.dumps(profile.uniform(2, name="two").to_dict()))
    result = run("simulate", "-p", prof, "--schedule-csv", path, "--trace", tmp_path / "t.json")
    assert result.exit_code == 1
    first, *rest = result.stderr.split("\n")
    assert first.startswith("error: invalid schedule: stage 1 receives forward micro-batch 1")
    assert any(">1F1<" in line for line in rest)
    assert not (tmp_path / "t.json").exists()


def test_deadlocking_custom_schedule(tmp_path) -> None:
    path = tmp_path / "dead.csv"
    path.write_text("0F0,0B0,0F1,0B1\n1F0,1F1,1B0,1B1\n")
    prof = tmp_path / "two.json"
    prof.write_text(json.dumps(profile.uniform(2, name="two").to_dict()))
    result = run("solve", "-p", prof, "--schedule-csv", path, "-o", tmp_path / "plan.json")
    assert result.exit_code == 1
    assert result.stderr.startswith("error: schedule deadlocks: ")
    assert "0B0 (rank 0)" in result.stderr and "1B0 (rank 1)" in result.stderr
    assert not (tmp_path / "plan.json").exists()


@pytest.mark.parametrize(
    "args",
    [
        ["simulate", "-s", "1f1b", "-m", "8"],  # --profile missing
        ["simulate", *TOY[:4], "--microbatches", "0"],
        ["simulate", *TOY, "--no-such-option"],
        ["simulate", *TOY[:4], "--microbatches", "eight"],
        ["show"],
        ["no-such-command"],
        ["show-schedule", "-s", "1f1b", "-m", "4"],  # --ranks missing
    ],
)
def test_usage_errors_exit_2(args) -> None:
    result = CliRunner().invoke(app, args)
    assert result.exit_code == 2
    assert "Traceback" not in result.stdout + result.stderr


def test_help_texts() -> None:
    out = ok("--help").stdout
    for command in ("simulate", "schedules", "show-schedule", "solve", "show", "whatif"):
        assert command in out
    assert "Example: tfplan simulate" in ok("simulate", "--help").stdout.replace("\n", " ")


def test_python_m_tfplan_help() -> None:
    proc = subprocess.run(
        [sys.executable, "-m", "tfplan", "--help"], capture_output=True, text=True, timeout=60, cwd=ROOT
    )
    assert proc.returncode == 0, proc.stderr
    assert "simulate" in proc.stdout and "solve" in proc.stdout


def test_profile_analytic_per_stage_and_per_layer(tmp_path) -> None:
    out = tmp_path / "p.json"
    ok("profile", "--analytic", "--model", "llama3-8b", "--gpu", "h200", "--stages", "4", "--stages-per-rank", "2",
       "--microbatch-size", "1", "--seq-len", "2048", "-o", out)
    prof = profile.load(out)
    assert len(prof.stages) == 8 and prof.source["kind"] == "analytic" and prof.stages[0].backward_frozen_ms == 0
    layers = tmp_path / "layers.json"
    ok("profile", "--analytic", "--model", "llama3.2-1b", "--gpu", "a100", "--per-layer", "-o", layers)
    assert len(profile.load(layers).layers) == 16 + 2  # embedding, 16 blocks, head
    # A per-layer profile plans on any rank count; --layers-per-stage splits it explicitly.
    data = json.loads(ok("solve", "-p", layers, "-s", "1f1b", "-m", "8", "--ranks", "3", "--json").stdout)
    assert data["num_stages"] == 3
    split = json.loads(ok("solve", "-p", layers, "-s", "1f1b", "-m", "4", "--ranks", "2",
                          "--layers-per-stage", "9,9", "--json").stdout)
    assert split["num_stages"] == 2


def test_profile_analytic_bad_names(tmp_path) -> None:
    for args, message in ((["--model", "gpt5"], "known"), (["--gpu", "tpu"], "known"),
                          (["--model", "llama3-8b", "--mfu", "1.5"], "mfu"), ([], "--analytic needs --model")):
        result = run("profile", "--analytic", *args, "-o", tmp_path / "p.json")
        assert result.exit_code == 1 and result.stderr.startswith("error: "), result.stderr
        assert message in result.stderr
    assert list(tmp_path.iterdir()) == []


def test_the_cli_keeps_large_allocations_on_the_heap() -> None:
    # tfplan.solve.heap: after keep_large_allocations, a 64 MB numpy array comes from glibc's heap, not from a fresh
    # mapping (glibc's mallinfo2 counts mapped blocks in hblks). In a child process: the setting is per process.
    code = """
import ctypes, sys
import numpy as np
from tfplan.solve import heap
libc = ctypes.CDLL(None)
if not hasattr(libc, "mallinfo2"):
    print("skip"); sys.exit(0)
class Info(ctypes.Structure):
    _fields_ = [(name, ctypes.c_size_t) for name in ("arena", "ordblks", "smblks", "hblks", "hblkhd", "usmblks",
                                                    "fsmblks", "uordblks", "fordblks", "keepcost")]
libc.mallinfo2.restype = Info
def mapped_with(array_bytes):
    before = libc.mallinfo2().hblks
    a = np.ones(array_bytes // 8)
    return libc.mallinfo2().hblks - before
print(mapped_with(64 << 20), end=" ")
heap.keep_large_allocations()
print(mapped_with(64 << 20))
"""
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True, cwd=ROOT).stdout
    if out.strip() == "skip":
        pytest.skip("not glibc >= 2.33 (no mallinfo2)")
    assert out.split() == ["1", "0"]  # mapped by default, from the heap once the threshold is raised


@pytest.mark.parametrize("user", [None, "1"])
def test_the_cli_keeps_numpys_arrays_on_small_pages_unless_the_user_says(user: str | None) -> None:
    # tfplan.solve.heap.HUGE_PAGES_FOR_ARRAYS: after configure, numpy no longer asks for huge pages (its setter returns
    # the setting it replaces); a NUMPY_MADVISE_HUGEPAGE the user set is kept. In a child process.
    code = """
import numpy as np
from tfplan.solve import heap
heap.configure()
core = getattr(np, "_core", None) or np.core  # numpy 2, numpy 1
print(core.multiarray._set_madvise_hugepage(True))
"""
    env = {k: v for k, v in os.environ.items() if k != "NUMPY_MADVISE_HUGEPAGE"}
    if user is not None:
        env["NUMPY_MADVISE_HUGEPAGE"] = user
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True, cwd=ROOT, env=env)
    assert out.stdout.split() == (["False"] if user is None else ["True"])


def test_the_cli_keeps_one_malloc_arena_for_all_threads() -> None:
    # tfplan.solve.heap.ARENA_MAX: after keep_large_allocations, memory a worker thread allocates comes from the one
    # arena the main thread uses (glibc's malloc_stats lists each arena as "Arena N:" on stderr). In a child
    # process: the setting is per process.
    code = """
import ctypes, sys, threading
import numpy as np
from tfplan.solve import heap
libc = ctypes.CDLL(None)
if not hasattr(libc, "malloc_stats"):
    print("skip"); sys.exit(0)
if sys.argv[1] == "cli":
    heap.keep_large_allocations()
kept = []
worker = threading.Thread(target=lambda: kept.append(np.ones(1 << 17)))  # 1 MB
worker.start()
worker.join()
libc.malloc_stats()
"""
    arenas = []
    for mode in ("default", "cli"):
        run = subprocess.run([sys.executable, "-c", code, mode], capture_output=True, text=True, check=True, cwd=ROOT)
        if run.stdout.strip() == "skip":
            pytest.skip("not glibc (no malloc_stats)")
        arenas.append(sum(line.startswith("Arena ") for line in run.stderr.splitlines()))
    assert arenas == [2, 1]  # the worker's own arena by default, the main one with the CLI's setting
