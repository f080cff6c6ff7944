"""Learning efficiency from loss curves (tfrun.records.efficiency), by hand-computed curves, and in `tfrun compare`."""

from __future__ import annotations

import json
import math
from pathlib import Path

import pytest

from tests.tfrun.records.test_compare import _run_dir


def _rows(evals: dict[int, float], each: dict[int, list[float]] | None = None) -> list[dict]:
    """Metrics rows with evaluations after `steps` completed steps (row step = steps - 1)."""
    rows = []
    for steps in range(1, max(evals) + 1):
        row = {"step": steps - 1, "loss": 3.0}
        if steps in evals:
            row["eval_loss"] = evals[steps]
            if each is not None:
                row["eval_microbatch_losses"] = each[steps]
        rows.append(row)
    return rows


def test_a_run_that_needs_twice_the_steps_has_efficiency_one_half():
    from tfrun.records import efficiency

    # the unfrozen run falls 0.1 a step from 3.0; the frozen one 0.05 a step: at step s its loss is the unfrozen
    # run's at s / 2
    base = _rows({s: 3.0 - 0.1 * s for s in range(2, 21, 2)})
    run = _rows({s: 3.0 - 0.05 * s for s in range(4, 21, 4)})
    points = efficiency.pointwise(run, base)
    assert [p[0] for p in points] == [4, 8, 12, 16, 20]
    assert [p[1] for p in points] == pytest.approx([0.5] * 5)
    # second half: steps 12, 16, 20 (> 20 / 2)
    assert efficiency.summarise(points, 20) == {"efficiency": pytest.approx(0.5), "efficiency_eval_se": None,
                                                "efficiency_points": 3}


def test_outside_the_unfrozen_curve_efficiency_is_none():
    from tfrun.records import efficiency

    base = _rows({10: 2.0, 20: 1.5})
    run = _rows({10: 2.5, 20: 1.4})  # above the first evaluation; below the best
    assert [p[1] for p in efficiency.pointwise(run, base)] == [None, None]
    assert efficiency.summarise(efficiency.pointwise(run, base), 20)["efficiency"] is None


def test_the_running_minimum_reaches_a_loss_once():
    from tfrun.records.efficiency import steps_to_reach

    # a noisy uptick (2.2 after 2.0) does not make the curve reach 2.1 a second time, at 25 steps
    curve = [(10, 3.0), (20, 2.0), (30, 2.2), (40, 1.5)]
    assert steps_to_reach(curve, 2.1) == pytest.approx(19.0)
    assert steps_to_reach(curve, 3.0) == 10.0 and steps_to_reach(curve, 1.5) == pytest.approx(40.0)


def test_the_eval_sets_error_follows_the_paired_differences_and_the_slope():
    from tfrun.records import efficiency

    # four eval micro-batches; the frozen run's differ from the unfrozen run's by +0.01, -0.01, +0.03, -0.03
    # (mean 0, sd sqrt((2 x 0.0001 + 2 x 0.0009) / 3)), and the unfrozen curve's slope is 0.1 a step
    each = {s: [3.0 - 0.1 * s] * 4 for s in range(2, 21, 2)}
    base = _rows({s: 3.0 - 0.1 * s for s in range(2, 21, 2)}, each)
    offsets = [0.01, -0.01, 0.03, -0.03]
    run = _rows({20: 1.5}, {20: [1.5 + o for o in offsets]})
    se_loss = math.sqrt((2 * 1e-4 + 2 * 9e-4) / 3) / 2
    (steps, eff, se), = efficiency.pointwise(run, base)
    assert steps == 20 and eff == pytest.approx(15 / 20)
    assert se == pytest.approx(se_loss / 0.1 / 20)


def test_runs_of_one_cell_report_their_freeze_seeds_spread():
    from tfrun.records import efficiency

    rows = [{"efficiency": 0.8}, {"efficiency": 0.7}, {"efficiency": 0.9}, {"efficiency": None}, {"efficiency": 0.5}]
    configs = [{"plan_hash": "a", "freeze_seed": f, "out_dir": f"r{f}"} for f in (0, 1, 2)] + [
        {"plan_hash": "b", "freeze_seed": 0, "out_dir": "x"}, {"plan_hash": "b", "freeze_seed": 1, "out_dir": "y"}]
    efficiency.seed_spread(rows, [efficiency.cell_key(c) for c in configs])
    assert [r["efficiency_cell"] for r in rows[:3]] == [0.8] * 3
    assert rows[0]["efficiency_seed_spread"] == pytest.approx(0.2) and rows[0]["efficiency_seeds"] == 3
    assert rows[3]["efficiency_cell"] == 0.5 and rows[3]["efficiency_seed_spread"] is None
    assert rows[4]["efficiency_seeds"] == 1


def test_compare_reports_efficiency_measured_and_predicted(tmp_path):
    from typer.testing import CliRunner

    from tfrun.cli.app import app

    none = _run_dir(tmp_path, "none", "none", 500.0, {s: 3.0 - 0.1 * (s + 1) for s in range(1, 20, 2)},
                    wall_ms=[520.0] * 20)
    frozen = [_run_dir(tmp_path, f"plan-f{f}", "plan", 400.0, {s: 3.0 - 0.08 * (s + 1) for s in range(1, 20, 2)},
                       ratio=0.4, wall_ms=[420.0] * 20, freeze_seed=f) for f in (0, 1)]
    for folder in (none, *frozen):  # the noise the run measured: the model's inputs
        summary = json.loads((folder / "summary.json").read_text())
        summary |= {"noise_scale_tokens": [2000.0, 4000.0], "grad_sq_share": [0.5, 0.5]}
        (folder / "summary.json").write_text(json.dumps(summary))
    result = CliRunner().invoke(app, ["compare", str(none), *map(str, frozen), "--json"])
    assert result.exit_code == 0, result.output
    base, *rows = json.loads(result.output)["runs"]
    assert base["efficiency"] == 1.0 and base["efficiency_predicted"] == 1.0
    for row in rows:
        # after s steps the frozen loss is the unfrozen one's after 0.8 s (rows count from step 0)
        assert row["efficiency"] == pytest.approx(0.8) and row["efficiency_seed_spread"] == pytest.approx(0.0)
        assert row["efficiency_seeds"] == 2
        # stage ratios (0.2, 0.6) at B = 4096: 0.5 (0.8B / (0.8B + 2000)) + 0.5 (0.4B / (0.4B + 4000)) over
        # the unfrozen 0.5 (B / (B + 2000)) + 0.5 (B / (B + 4000))
        b = 4096.0
        want = (0.5 * 0.8 * b / (0.8 * b + 2000) + 0.5 * 0.4 * b / (0.4 * b + 4000)) / (
            0.5 * b / (b + 2000) + 0.5 * b / (b + 4000))
        assert row["efficiency_predicted"] == pytest.approx(want)
    human = CliRunner().invoke(app, ["compare", str(none), *map(str, frozen)])
    assert human.exit_code == 0 and "0.800 (0.000 over 2)" in human.output
    png = tmp_path / "c.png"
    assert CliRunner().invoke(app, ["compare", str(none), *map(str, frozen), "--plot", str(png)]).exit_code == 0
    assert Path(png).read_bytes()[:4] == b"\x89PNG"
