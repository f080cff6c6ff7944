"""`tfplan solve`, `tfplan show`, `tfplan whatif` (tfplan.cli.plans): plans and their JSON, the backends agreeing,
the stage-0 anchor, per-stage caps, written files shown again, sweeps, target speedups."""

from __future__ import annotations

import json
import re

import pytest

from tests.tfplan.cli.runner import HETERO, TOY, UNIFORM, ok, run
from tfplan.plan import plan as plan_mod
from tfplan.schedule import schedules


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
        ("0.5", r"^error: --target-speedup must be a number >= 1, got 0\.5"),
        ("nan", r"^error: --target-speedup must be a number >= 1, got nan"),
    ],
)
def test_target_speedup_unreachable(tmp_path, target: str, message: str) -> None:
    result = run("solve", *TOY, "--target-speedup", target, "-o", tmp_path / "plan.json")
    assert result.exit_code == 1
    assert re.search(message, result.stderr), result.stderr
    assert list(tmp_path.iterdir()) == []


def test_whatif_json_is_strict_json() -> None:
    out = ok("whatif", "-p", UNIFORM, "--schedules", "1f1b", "-m", "2,4", "--caps", "0.5", "--json").stdout

    def reject(constant: str):
        raise ValueError(f"{constant} is not JSON")

    rows = json.loads(out, parse_constant=reject)
    assert rows[0]["skipped"] and rows[0]["planned_ms"] is None


def test_the_learning_model_is_selectable_by_name(tmp_path) -> None:
    """--learning-model reads the profile's noise section under another model (tfplan.cost.goodput Note [learning
    models]): the goodput record names it, solve, show and whatif take it, and adam on a section without update
    shares (a schema-3 profile's) is one line."""
    from tests.conftest import PROFILES

    noisy = str(PROFILES / "tiny-cpu-2stages-mb2.json")
    args = ["solve", "-p", noisy, "-s", "1f1b", "-m", "8", "--objective", "goodput", "--json"]
    default = json.loads(ok(*args).output)["goodput"]
    old = json.loads(ok(*args, "--learning-model", "mccandlish").output)["goodput"]
    momentum = json.loads(ok(*args, "--learning-model", "momentum").output)["goodput"]
    assert default["noise"]["learning_model"] == "adam"  # the shipped profile names the default
    assert old["noise"]["learning_model"] == "mccandlish" and momentum["noise"]["learning_model"] == "momentum"
    assert momentum["efficiency"] > old["efficiency"]  # the momentum model prices freezing lower
    legacy = json.loads(open(noisy).read())
    legacy["schema_version"] = 3
    for key in ("learning_model", "update_share"):
        del legacy["noise"][key]
    (tmp_path / "v3.json").write_text(json.dumps(legacy))
    v3 = ["solve", "-p", str(tmp_path / "v3.json"), "-s", "1f1b", "-m", "8", "--objective", "goodput", "--json"]
    assert json.loads(ok(*v3).output)["goodput"]["noise"]["learning_model"] == "mccandlish"
    result = run(*v3, "--learning-model", "adam")
    assert result.exit_code == 1 and "no update_share" in result.output and "\n" not in result.output.strip()
    assert run(*args, "--learning-model", "sgd").exit_code == 2  # a usage error, named when parsed
    plan = tmp_path / "plan.json"
    ok("solve", "-p", noisy, "-s", "1f1b", "-m", "8", "-o", str(plan))
    shown = json.loads(ok("show", str(plan), "--profile", noisy, "--learning-model", "momentum", "--json").output)
    assert shown["goodput"]["noise"]["learning_model"] == "momentum"
    rows = json.loads(ok("whatif", "-p", noisy, "--schedules", "1f1b", "-m", "8", "--caps", "0.9", "--json",
                         "--learning-model", "momentum").output)
    assert rows[0]["goodput"] > 0


def test_outputs_that_cannot_be_written_or_would_overwrite_an_input_are_refused(tmp_path) -> None:
    profile = tmp_path / "profile.json"
    profile.write_text(open(UNIFORM).read())
    for args, message in [
        (["solve", "-p", profile, "-s", "1f1b", "-m", "8", "-o", profile], "it is also an input of this command"),
        (["solve", *TOY, "-o", "."], "cannot write .: it is a folder"),
        (["whatif", "-p", profile, "--schedules", "1f1b", "-m", "8", "--caps", "0.5", "--csv", tmp_path / "w.csv",
          "--plot", tmp_path / "nodir" / "w.png"], "folder .*nodir does not exist"),
    ]:
        result = run(*args)
        assert result.exit_code == 1 and re.search(message, result.stderr), result.stderr
    assert sorted(p.name for p in tmp_path.iterdir()) == ["profile.json"]  # the whatif's CSV not written either
    assert json.loads(profile.read_text())["name"] == "toy-uniform-4"


def test_a_failed_solve_keeps_the_plan_that_was_there(tmp_path) -> None:
    plan = tmp_path / "plan.json"
    ok("solve", *TOY, "-o", plan)
    before = plan.read_bytes()
    (tmp_path / "plan.csv").unlink()
    (tmp_path / "plan.csv").mkdir()  # its schedule CSV cannot be written: the earlier plan stays as it was
    result = run("solve", *TOY, "-c", "0.5", "-o", plan)
    assert result.exit_code == 1 and "plan.csv: it is a folder" in result.stderr
    assert plan.read_bytes() == before


@pytest.mark.parametrize(("args", "message"), [
    (["simulate", *TOY, "--dp-link", "ib"], "--dp-link is the link of the replicas' gradient reduction: it needs"),
    (["whatif", "-p", UNIFORM, "--schedules", "1f1b", "-m", "0,8", "--caps", "0.5"],
     "--microbatches: every count must be >= 1, got 0,8"),
])
def test_options_that_would_be_ignored_are_errors(args, message) -> None:
    result = run(*args)
    assert result.exit_code == 1 and message in result.stderr, result.stderr
