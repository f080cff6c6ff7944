"""Plan files: write -> load round trip (JSON + schedule CSV), what the file holds, deterministic bytes, file
modes and failed writes, the typed solver section, every solver's plan loads, loading without OR-Tools, and
the profile's provenance."""

from __future__ import annotations

import os
import re
import stat
import subprocess
import sys

import pytest

from tests.conftest import PROFILES
from tests.tfplan.plan.toy_plans import HETERO, _plan
from tfplan.cost import profile
from tfplan.cost.profile import Profile
from tfplan.errors import TfplanError
from tfplan.plan import plan as plan_mod
from tfplan.plan.job import solve_dag
from tfplan.schedule import schedules
from tfplan.solve import lp, solver
from tfplan.step import dag as dag_mod


@pytest.mark.parametrize(("schedule", "m"), [("1f1b", 8), ("interleaved-zb", 6), ("zbv", 5), ("dualpipev", 4)])
def test_write_load_round_trip(tmp_path, schedule: str, m: int) -> None:
    plan = _plan(schedule, m, caps=0.7)
    path = tmp_path / "plan.json"
    csv_path = plan_mod.write(plan, path)
    assert csv_path == tmp_path / "plan.csv"
    assert sorted(p.name for p in tmp_path.iterdir()) == ["plan.csv", "plan.json"]  # no temp files left
    # The CSV beside it is the schedule in torch's compute-only format.
    assert csv_path.read_text() == schedules.to_csv(plan.schedule)
    assert schedules.parse_csv(csv_path.read_text()) == [list(r) for r in plan.schedule.order]

    loaded = plan_mod.load(path)
    assert loaded.schedule.order == plan.schedule.order
    assert loaded.schedule.name == plan.schedule.name
    assert loaded.schedule.stage_to_rank == plan.schedule.stage_to_rank
    assert loaded.ratios == plan.ratios
    assert loaded.caps == plan.caps
    assert loaded.predicted == plan.predicted
    assert loaded.profile_name == plan.profile_name and loaded.profile_hash == plan.profile_hash
    assert loaded.profile_hash == profile.load(HETERO).content_hash()
    assert loaded.dag.stage_costs == plan.dag.stage_costs
    assert loaded.dag.p2p_ms == plan.dag.p2p_ms
    assert loaded.solver == plan.solver


def test_plan_json_contents(hetero_plan, plan_obj) -> None:
    obj = plan_obj
    assert obj["schema_version"] == 3
    assert re.fullmatch(r"\d{4}-\d\d-\d\dT\d\d:\d\d:\d\dZ", obj["created"])
    sched = obj["schedule"]
    assert (sched["name"], sched["num_ranks"], sched["num_stages"], sched["num_microbatches"]) == ("1f1b", 4, 4, 8)
    assert sched["order"][3][:3] == ["3F0", "3B0", "3F1"]
    assert obj["profile"]["name"] == "toy-hetero-4"
    assert obj["profile"]["hash"].startswith("sha256:")
    assert obj["max_freeze_ratio"] == [0.9] * 4
    assert set(obj["predicted"]) >= {"no_freeze_ms", "planned_ms", "all_frozen_ms", "speedup"}
    assert "actions" not in obj  # Note [compact plan]: no per-action objects
    # One ratio per (stage, micro-batch): that of its B action (1F1B has no I/W); F actions have none.
    table = obj["freeze_ratio"]
    assert len(table) == 4 and all(len(row) == 8 for row in table)
    dag = hetero_plan.dag
    for v, a in enumerate(dag.actions):
        if a.kind == "B":
            assert table[a.stage][a.mb] == hetero_plan.ratios[v]
        else:
            assert hetero_plan.ratios[v] == 0.0
    assert obj["solver"]["status"] == "OPTIMAL"
    assert [p["name"] for p in obj["solver"]["phases"]] == ["makespan", "total_freeze", "even_spread"]
    assert [p["gap"] for p in obj["solver"]["phases"]] == [None] * 3  # GLOP: its own OPTIMAL (Note [LP certificate])
    assert obj["solver"]["wall_s"] >= 0
    assert obj["solver"]["time_limit_s"] == lp.DEFAULT_TIME_LIMIT_S
    # The stated per-stage mean is the mean of the listed ratios over each stage's freezable actions.
    for s in range(4):
        assert obj["mean_freeze_ratio"][s] == pytest.approx(sum(table[s]) / len(table[s]), abs=1e-12)
        assert obj["mean_freeze_ratio"][s] <= 0.9 + 1e-7


def _normalised(text: str) -> str:
    """Plan text with the creation time and solver wall times blanked out."""
    text = re.sub(r'"created": "[^"]*"', '"created": "-"', text)
    return re.sub(r'"(wall_s|build_s)": [0-9.e+-]+', r'"\1": 0', text)


def test_same_inputs_give_byte_identical_plans(tmp_path) -> None:
    a, b = tmp_path / "a.json", tmp_path / "b.json"
    plan_mod.write(_plan("interleaved-1f1b", 4, caps=[0.9, 0.5, 0.7, 0.3]), a)
    plan_mod.write(_plan("interleaved-1f1b", 4, caps=[0.9, 0.5, 0.7, 0.3]), b)
    ta, tb = a.read_text(), b.read_text()
    assert _normalised(ta) == _normalised(tb)
    assert ta.count('"wall_s"') == 4  # three phases and the total: everything else is compared as is
    assert (tmp_path / "a.csv").read_bytes() == (tmp_path / "b.csv").read_bytes()
    assert ta.endswith("}\n")


def test_plan_files_are_readable_like_any_written_file(tmp_path) -> None:
    old = os.umask(0o022)
    try:
        plan_mod.write(_plan("gpipe", 2), tmp_path / "plan.json")
    finally:
        os.umask(old)
    for name in ("plan.json", "plan.csv"):
        assert stat.S_IMODE((tmp_path / name).stat().st_mode) == 0o644, name


def test_failed_write_is_a_user_error_and_leaves_nothing(tmp_path) -> None:
    (tmp_path / "plan.json").mkdir()
    with pytest.raises(TfplanError):
        plan_mod.write(_plan("gpipe", 2), tmp_path / "plan.json")
    assert sorted(p.name for p in tmp_path.iterdir()) == ["plan.json"]


def test_the_solver_section_is_a_typed_record(hetero_plan, plan_obj) -> None:
    record = hetero_plan.solver
    assert isinstance(record, lp.SolverRecord) and record.backend == "glop" and record.status == "OPTIMAL"
    assert record.to_dict() == plan_obj["solver"]
    assert lp.SolverRecord.from_dict(plan_obj["solver"]) == record


@pytest.mark.parametrize("backend", ["glop", "fastlp"])
@pytest.mark.parametrize("name", sorted(schedules.SCHEDULES))
def test_every_plan_a_solver_writes_loads(tmp_path, name: str, backend: str) -> None:
    # One cap tolerance (lp.CAP_TOL) for the solvers' last check and the loader: what they write loads.
    spec = schedules.get_spec(name)
    sched = schedules.generate(name, 3, 12, spec.default_stages_per_rank)
    prof = Profile(name="p", p2p_ms=0.03, stages=tuple(
        profile.StageCost(forward_ms=1.0 + 0.1 * s, backward_ms=2.0, backward_frozen_ms=0.7 + 0.1 * s,
                          backward_input_ms=1.1, backward_weight_ms=0.9 + 0.05 * s, backward_weight_frozen_ms=0.1)
        for s in range(sched.num_stages)
    ))
    dag = dag_mod.build(sched, prof)
    caps = [0.37, 0.9, 0.123456789, 1.0, 0.5, 0.0][: sched.num_stages]
    caps += [0.77] * (sched.num_stages - len(caps))
    plan = plan_mod.make_plan(dag, solve_dag(dag, caps, backend=backend), caps, prof)
    plan_mod.write(plan, tmp_path / "plan.json")
    loaded = plan_mod.load(tmp_path / "plan.json")
    assert loaded.ratios == plan.ratios and loaded.solver == plan.solver
    for mean, cap in zip(loaded.mean_ratio_per_stage(), caps):
        assert mean <= cap + 1e-12


def test_loading_a_plan_does_not_import_ortools(tmp_path, hetero_plan) -> None:
    plan_mod.write(hetero_plan, tmp_path / "plan.json")
    code = (
        "import sys, tfplan.plan.plan\n"
        f"p = tfplan.plan.plan.load({str(tmp_path / 'plan.json')!r})\n"
        "assert p.solver.backend == 'glop'\n"
        "print(sorted(m for m in sys.modules if m.split('.')[0] == 'ortools'))\n"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "[]", out.stdout


def test_a_plan_records_its_profiles_provenance(tmp_path, hetero_plan) -> None:
    assert hetero_plan.profile_source == {"kind": "hand", "note": profile.load(HETERO).source["note"]}
    measured = profile.load(PROFILES / "tiny-cpu-2stages.json")
    d = dag_mod.build(schedules.generate("1f1b", 2, 4), measured)
    plan = plan_mod.make_plan(d, solver.solve(d, 0.9), [0.9, 0.9], measured)
    src = plan.profile_source
    assert {k: src[k] for k in ("kind", "model", "microbatch_size", "seq_len", "device", "torch")} == {
        "kind": "measured", "model": "tiny", "microbatch_size": 4, "seq_len": 128, "device": "cpu",
        "torch": measured.source["torch"]}
    assert all(isinstance(v, (str, int, float, bool, type(None))) for v in src.values())  # nested notes dropped
    plan_mod.write(plan, tmp_path / "p.json")
    loaded = plan_mod.load(tmp_path / "p.json")
    assert loaded.profile_source == src and loaded.profile_hash == measured.content_hash()


@pytest.mark.parametrize("name", ["plan.csv", "plan.CSV"])
def test_a_plan_path_ending_in_csv_is_refused(tmp_path, name) -> None:
    # (plan.CSV and its schedule CSV plan.csv are one file where case does not count)
    with pytest.raises(TfplanError, match="must not end in .csv"):
        plan_mod.write(_plan("gpipe", 2), tmp_path / name)
    assert list(tmp_path.iterdir()) == []
