"""Data parallelism in the planner: the gradient reduction in each rank's tail, whatif/simulate/solve --dp."""

from __future__ import annotations

import csv
import io
import json

import pytest
from typer.testing import CliRunner

from tests.conftest import PROFILES
from tfplan.cli.app import app
from tfplan.cost import dataparallel, profile
from tfplan.cost.hardware import LinkSpec
from tfplan.errors import TfplanError

EIGHT_B = str(PROFILES / "llama3.1-8b-h200-4stages.json")
IB = LinkSpec(name="ib", gb_per_s=50.0, latency_us=15.0)


def test_ring_allreduce_closed_form():
    assert dataparallel.allreduce_ms(1e9, 1, IB) == 0.0
    assert dataparallel.allreduce_ms(1e9, 2, IB) == pytest.approx(1e9 / 50e9 * 1e3 + 2 * 0.015)
    assert dataparallel.allreduce_ms(0.0, 8, IB) == 0.0


def test_with_dp_adds_the_reduction_to_each_stage_tail_and_records_it():
    base = profile.load(EIGHT_B)
    dp8 = dataparallel.with_dp(base, 8, IB)
    for before, after in zip(base.stages, dp8.stages):
        assert before.grad_bytes > 0
        assert after.tail_ms == pytest.approx(before.tail_ms + dataparallel.allreduce_ms(before.grad_bytes, 8, IB))
    assert dp8.dp == 8 and dp8.source["dp"]["replicas"] == 8
    # From a profile measured at 2 replicas, 8 adds only the difference; 1 is the profile itself.
    dp2 = dataparallel.with_dp(base, 2, IB)
    again = dataparallel.with_dp(dp2, 8, IB)
    assert [c.tail_ms for c in again.stages] == pytest.approx([c.tail_ms for c in dp8.stages])
    assert dataparallel.with_dp(base, 1, None) is base


def test_dp_errors_are_one_line():
    base = profile.load(EIGHT_B)
    with pytest.raises(TfplanError, match="--dp needs --dp-link"):
        dataparallel.with_dp(base, 4, None)
    with pytest.raises(TfplanError, match="no grad_bytes"):
        dataparallel.with_dp(profile.load(PROFILES / "toy-uniform-4.json"), 4, IB)
    with pytest.raises(TfplanError, match="GBPS:LATENCY_US"):
        dataparallel.parse_link("fast:x", base)
    for text in ("1:inf", "nan:1", "inf:0", "0:1", "1:-1"):  # (NaN once made every tail 0, inf a traceback)
        with pytest.raises(TfplanError, match="bandwidth must be finite and > 0, latency finite and >= 0"):
            dataparallel.parse_link(text, base)
    assert dataparallel.parse_link("ib", base).name == "ib-ndr"  # the profile's GPU (H200) generation
    assert dataparallel.parse_link("12.5:40", base).gb_per_s == 12.5


def test_whatif_dp8_is_slower_and_its_speedup_smaller_where_the_reduction_is_exposed(tmp_path):
    args = ["whatif", "-p", EIGHT_B, "--schedules", "1f1b", "-m", "8", "--caps", "0.9", "--dp", "1,8",
            "--dp-link", "ib"]
    result = CliRunner().invoke(app, [*args, "--json"])
    assert result.exit_code == 0, result.output
    one, eight = json.loads(result.output)
    assert (one["dp"], eight["dp"]) == (1, 8)
    assert eight["no_freeze_ms"] > one["no_freeze_ms"] and eight["speedup"] < one["speedup"]
    result = CliRunner().invoke(app, [*args, "--csv", str(tmp_path / "w.csv")])
    assert result.exit_code == 0, result.output
    rows = list(csv.DictReader(io.StringIO((tmp_path / "w.csv").read_text())))
    assert [r["dp"] for r in rows[:2]] == ["1", "8"]


def test_simulate_shows_the_tail_and_solve_plans_for_dp():
    result = CliRunner().invoke(app, ["simulate", "-p", EIGHT_B, "-s", "1f1b", "-m", "8", "--dp", "8",
                                      "--dp-link", "ib", "--gantt"])
    assert result.exit_code == 0, result.output
    assert "~~~~" in result.output and "tail (optimizer, gradient reduction)" in result.output
    solved = CliRunner().invoke(app, ["solve", "-p", EIGHT_B, "-s", "1f1b", "-m", "8", "--dp", "8", "--dp-link",
                                      "ib", "--json"])
    plain = CliRunner().invoke(app, ["solve", "-p", EIGHT_B, "-s", "1f1b", "-m", "8", "--json"])
    assert json.loads(solved.output)["speedup"] < json.loads(plain.output)["speedup"]
