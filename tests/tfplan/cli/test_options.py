"""Bad input on every command (tfplan.cli.options.user_errors): exit 1, one `error:` line on stderr, no
traceback, no file written; an output path that is a folder; a custom schedule that is invalid or deadlocks."""

from __future__ import annotations

import json
import re

import pytest
from typer.testing import CliRunner

from tests.conftest import PROFILES
from tests.tfplan.cli.runner import TOY, UNIFORM, ok, run
from tfplan.cli.app import app
from tfplan.cost import profile
from tfplan.schedule import schedules


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
