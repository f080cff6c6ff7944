"""Plan files: write -> load round trip (JSON + schedule CSV), predictions reproduced by the simulator,
deterministic bytes, load errors naming the field, the typed solver section, version-1 plans, every solver's
plan loads, loading without OR-Tools."""

from __future__ import annotations

import copy
import json
import os
import re
import stat
import subprocess
import sys

import pytest
from hypothesis import given, settings

from tests.conftest import PROFILES
from tests.fuzzing import json_values, mutated
from tfplan.cost import profile
from tfplan.cost.profile import Profile
from tfplan.errors import TfplanError
from tfplan.plan import plan as plan_mod
from tfplan.plan.job import JobSpec, solve_dag, solve_job
from tfplan.schedule import schedules
from tfplan.solve import lp, solver
from tfplan.step import dag as dag_mod
from tfplan.step.simulate import simulate

HETERO = str(PROFILES / "toy-hetero-4.json")
UNIFORM = str(PROFILES / "toy-uniform-4.json")


def _plan(schedule: str = "1f1b", m: int = 8, caps=0.9, path: str = HETERO, **kw) -> plan_mod.Plan:
    return solve_job(JobSpec(profile_path=path, schedule=schedule, num_microbatches=m, **kw), caps)


@pytest.fixture(scope="module")
def hetero_plan() -> plan_mod.Plan:
    return _plan()


@pytest.fixture
def plan_obj(hetero_plan) -> dict:
    return json.loads(json.dumps(plan_mod.to_dict(hetero_plan)))


def _as_version_2(obj: dict) -> dict:
    """A version-3 plan object as tfplan wrote it in version 2 (issue 9 to issue 23): one object per action
    with its name, rank, ratio, planned start and duration and both costs, instead of the ratio table."""
    plan = plan_mod.from_dict(obj)
    dag = plan.dag
    sim = simulate(dag, dag.durations(list(plan.ratios)))
    old = {k: v for k, v in copy.deepcopy(obj).items() if k != "freeze_ratio"} | {"schema_version": 2}
    old["actions"] = [
        {"action": str(a), "rank": dag.rank[v], "freeze_ratio": plan.ratios[v], "start_ms": sim.start_ms[v],
         "duration_ms": sim.end_ms[v] - sim.start_ms[v], "max_ms": dag.d_max[v], "min_ms": dag.d_min[v]}
        for v, a in enumerate(dag.actions)
    ]
    return json.loads(json.dumps(old))


@pytest.fixture
def plan_obj_v2(plan_obj) -> dict:
    return _as_version_2(plan_obj)


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


def test_simulator_reproduces_planned_ms_from_the_file(hetero_plan, plan_obj) -> None:
    # Version 3 keeps no timeline (Note [compact plan]): the ratio table and the stage costs give it back.
    dag = hetero_plan.dag
    table = plan_obj["freeze_ratio"]
    ratios = [table[a.stage][a.mb] if a.kind in "BW" else 0.0 for a in dag.actions]
    sim = simulate(dag, dag.durations(ratios))
    predicted = plan_obj["predicted"]
    assert sim.batch_time_ms == pytest.approx(predicted["planned_ms"], rel=1e-9)
    # The plan's makespan is the LP's (within the solver's tolerances).
    assert predicted["planned_ms"] == pytest.approx(plan_obj["solver"]["lp_makespan_ms"], rel=1e-8)


def test_version_2_plans_still_load(hetero_plan, plan_obj_v2) -> None:
    # A version-2 file's timeline is what re-simulating its ratios gives, and it loads to the same plan.
    dag = hetero_plan.dag
    by_name = {a["action"]: a for a in plan_obj_v2["actions"]}
    sim = simulate(dag, [by_name[str(a)]["duration_ms"] for a in dag.actions])
    assert sim.batch_time_ms == pytest.approx(plan_obj_v2["predicted"]["planned_ms"], rel=1e-9)
    for v, a in enumerate(dag.actions):
        item = by_name[str(a)]
        assert sim.start_ms[v] == pytest.approx(item["start_ms"], rel=1e-9, abs=1e-12)
    loaded = plan_mod.from_dict(plan_obj_v2)
    assert loaded.ratios == hetero_plan.ratios and loaded.predicted == hetero_plan.predicted
    assert loaded.solver == hetero_plan.solver


def test_a_plan_file_is_compact(tmp_path) -> None:
    # Note [compact plan]: a ratio per (stage, micro-batch) instead of an object per action; at 4 x 64 the file
    # is under a fifth of version 2's, and it holds each number once.
    plan = _plan("1f1b", 64)
    plan_mod.write(plan, tmp_path / "plan.json")
    v2 = tmp_path / "v2.json"
    v2.write_text(json.dumps(_as_version_2(json.loads((tmp_path / "plan.json").read_text())), indent=1))
    size, old = (tmp_path / "plan.json").stat().st_size, v2.stat().st_size
    assert size < old / 5, (size, old)
    assert plan_mod.load(v2).ratios == plan_mod.load(tmp_path / "plan.json").ratios == plan.ratios


def test_predictions(hetero_plan) -> None:
    p = hetero_plan.predicted
    dag = hetero_plan.dag
    assert p.speedup == p.no_freeze_ms / p.planned_ms
    assert p.to_dict()["speedup"] == p.no_freeze_ms / p.planned_ms
    assert p.no_freeze_ms == simulate(dag).batch_time_ms
    assert p.all_frozen_ms == simulate(dag, dag.d_min).batch_time_ms
    assert p.planned_ms == simulate(dag, dag.durations(list(hetero_plan.ratios))).batch_time_ms
    assert p.all_frozen_ms <= p.planned_ms <= p.no_freeze_ms
    # Uniform baseline: every freezable action at the plan's overall mean ratio.
    groups = [v for g in dag.freeze_groups() for v in g]
    mean = sum(hetero_plan.ratios[v] for v in groups) / len(groups)
    assert p.uniform_ms == simulate(dag, dag.durations(mean)).batch_time_ms
    assert p.planned_ms <= p.uniform_ms + 1e-9  # schedule awareness never loses to uniform freezing
    assert p.no_freeze_bubble_fraction == simulate(dag).bubble_fraction


def test_step_overhead_is_in_every_prediction(tmp_path) -> None:
    base = profile.load(UNIFORM)
    prof = Profile(name="o", p2p_ms=0.0, step_overhead_ms=5.0, stages=base.stages)
    dag = dag_mod.build(schedules.generate("gpipe", 4, 8), prof)
    plan = plan_mod.make_plan(dag, solver.solve(dag, 0.9), [0.9] * 4, prof)
    p = plan.predicted
    assert (p.no_freeze_ms, p.all_frozen_ms) == (38.0, 27.0)
    assert p.planned_ms == pytest.approx(27.8, rel=1e-8)
    assert p.speedup == pytest.approx(38.0 / 27.8, rel=1e-8)
    plan_mod.write(plan, tmp_path / "p.json")
    assert plan_mod.load(tmp_path / "p.json").predicted == p


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


# ---------------------------------------------------------------------------------------------------------
# Load errors


def _drop(obj: dict, key: str) -> dict:
    obj = copy.deepcopy(obj)
    del obj[key]
    return obj


def _edit(obj: dict, fn) -> dict:
    obj = copy.deepcopy(obj)
    fn(obj)
    return obj


def _freeze_all_of_stage_0(obj: dict) -> None:
    for item in obj["actions"]:
        if item["action"].startswith("0B"):
            item["freeze_ratio"] = 1.0


def _v2(mutate):
    """A mutation of the version-2 form of the plan (the per-action list of versions 1-2)."""
    return lambda o: mutate(_as_version_2(o))


BAD_PLANS = [
    ("missing schedule", lambda o: _drop(o, "schedule"), r"^schedule: missing required field"),
    (
        "missing order",
        lambda o: _edit(o, lambda x: x["schedule"].pop("order")),
        r"^schedule\.order: missing required field",
    ),
    (
        "bad action string",
        lambda o: _edit(o, lambda x: x["schedule"]["order"][1].__setitem__(2, "1X1")),
        r"^schedule\.order: not a compute action .*'1X1'",
    ),
    (
        "ratio above 1",
        _v2(lambda o: _edit(o, lambda x: x["actions"][9].__setitem__("freeze_ratio", 1.5))),
        r"^actions\[9\]\.freeze_ratio: must be in \[0, 1\], got 1\.5",
    ),
    (
        "negative ratio",
        _v2(lambda o: _edit(o, lambda x: x["actions"][3].__setitem__("freeze_ratio", -0.1))),
        r"^actions\[3\]\.freeze_ratio: must be in \[0, 1\], got -0\.1",
    ),
    (
        "ratio not a number",
        _v2(lambda o: _edit(o, lambda x: x["actions"][2].__setitem__("freeze_ratio", "0.5"))),
        r"^actions\[2\]\.freeze_ratio: wrong type str",
    ),
    ("missing actions", _v2(lambda o: _drop(o, "actions")), r"^actions: missing required field"),
    (
        "an action left out",
        _v2(lambda o: _edit(o, lambda x: x["actions"].pop(5))),
        r"^actions: must list every scheduled action once \(missing \['\d[FB]\d'\]",
    ),
    (
        "an action twice",
        _v2(lambda o: _edit(o, lambda x: x["actions"].append(dict(x["actions"][0])))),
        r"^actions\[64\]\.action: 0F0 listed twice",
    ),
    (
        "action missing its name",
        _v2(lambda o: _edit(o, lambda x: x["actions"][4].pop("action"))),
        r"^actions\[4\]\.action: missing required field",
    ),
    (
        "mean above cap",
        _v2(lambda o: _edit(o, _freeze_all_of_stage_0)),
        r"^mean_freeze_ratio: stage 0 freezes 1 on average, above its cap 0\.9",
    ),
    ("schema_version 4", lambda o: o | {"schema_version": 4}, r"^schema_version: must be 1, 2 or 3, got 4"),
    ("schema_version missing", lambda o: _drop(o, "schema_version"), r"^schema_version: must be 1, 2 or 3, got null"),
    (
        "table ratio above 1",
        lambda o: _edit(o, lambda x: x["freeze_ratio"][1].__setitem__(3, 1.5)),
        r"^freeze_ratio\[1\]\[3\]: must be in \[0, 1\], got 1\.5",
    ),
    (
        "table ratio not a number",
        lambda o: _edit(o, lambda x: x["freeze_ratio"][2].__setitem__(0, "0.5")),
        r"^freeze_ratio\[2\]\[0\]: must be a number, got \"0\.5\"",
    ),
    (
        "table row too short",
        lambda o: _edit(o, lambda x: x["freeze_ratio"][3].pop()),
        r"^freeze_ratio\[3\]: must list one ratio per micro-batch \(8\)",
    ),
    (
        "table without a stage",
        lambda o: _edit(o, lambda x: x["freeze_ratio"].pop()),
        r"^freeze_ratio: must have one row per stage \(4\), got 3",
    ),
    ("missing ratio table", lambda o: _drop(o, "freeze_ratio"), r"^freeze_ratio: missing required field"),
    (
        "table mean above cap",
        lambda o: _edit(o, lambda x: x["freeze_ratio"].__setitem__(0, [1.0] * 8)),
        r"^mean_freeze_ratio: stage 0 freezes 1 on average, above its cap 0\.9",
    ),
    (
        "solver phase missing its objective",
        lambda o: _edit(o, lambda x: x["solver"]["phases"][2].pop("objective")),
        r"^solver\.phases\[2\]\.objective: missing required field",
    ),
    (
        "solver phase missing its gap",
        lambda o: _edit(o, lambda x: x["solver"]["phases"][0].pop("gap")),
        r"^solver\.phases\[0\]\.gap: missing required field",
    ),
    (
        "solver section missing a key",
        lambda o: _edit(o, lambda x: x["solver"].pop("backend")),
        r"^solver\.backend: missing required field",
    ),
    (
        "solver section with an unknown key",
        lambda o: _edit(o, lambda x: x["solver"].__setitem__("engine", "glop")),
        r"^solver\.engine: unknown field",
    ),
    (
        "solver status above its phases",
        lambda o: _edit(o, lambda x: x["solver"]["phases"][1].__setitem__("status", "FEASIBLE")),
        r"^solver\.status: says OPTIMAL but the phases make it FEASIBLE",
    ),
    (
        "solver phase status unknown",
        lambda o: _edit(o, lambda x: x["solver"]["phases"][1].__setitem__("status", "IMPRECISE")),
        r"^solver\.phases\[1\]\.status: must be one of OPTIMAL, FEASIBLE, got \"IMPRECISE\"",
    ),
    (
        "solver phases out of order",
        lambda o: _edit(o, lambda x: x["solver"]["phases"].reverse()),
        r"^solver\.phases: must be the first phases of makespan, total_freeze, even_spread in order",
    ),
    (
        "solver gap negative",
        lambda o: _edit(o, lambda x: x["solver"]["phases"][1].__setitem__("gap", -1.0)),
        r"^solver\.phases\[1\]\.gap: must be finite and >= 0, got -1",
    ),
    (
        "solver section not an object",
        lambda o: o | {"solver": [1]},
        r"^solver: must be an object",
    ),
    (
        "caps of the wrong length",
        lambda o: o | {"max_freeze_ratio": [0.9, 0.9]},
        r"^max_freeze_ratio: must list 4 caps in \[0, 1\]",
    ),
    (
        "cap above 1",
        lambda o: o | {"max_freeze_ratio": [0.9, 0.9, 1.1, 0.9]},
        r"^max_freeze_ratio: must list 4 caps in \[0, 1\]",
    ),
    (
        "num_ranks disagrees with order",
        lambda o: _edit(o, lambda x: x["schedule"].__setitem__("num_ranks", 5)),
        r"^schedule\.num_ranks: says 5 but the order has 4",
    ),
    (
        "invalid order",
        lambda o: _edit(o, lambda x: x["schedule"]["order"][0].reverse()),
        r"^invalid schedule: ",
    ),
    (
        "profile stage invalid",
        lambda o: _edit(o, lambda x: x["profile"]["stages"][1].__setitem__("forward_ms", -1)),
        r"^stages\[1\]\.forward_ms: must be >= 0",
    ),
    ("not an object", lambda o: [o], r"^plan: must be a JSON object"),
]


@pytest.mark.parametrize(("mutate", "message"), [b[1:] for b in BAD_PLANS], ids=[b[0] for b in BAD_PLANS])
def test_load_errors_name_the_field(tmp_path, plan_obj, mutate, message: str) -> None:
    bad = mutate(plan_obj)
    with pytest.raises(TfplanError) as info:
        plan_mod.from_dict(bad)
    assert re.search(message, str(info.value).split("\n")[0]), str(info.value)
    # Through a file, the message starts with the file's name.
    path = tmp_path / "bad.json"
    path.write_text(json.dumps(bad))
    with pytest.raises(TfplanError) as info:
        plan_mod.load(path)
    assert str(info.value).startswith(f"{path}: ")
    assert re.search(message.lstrip("^"), str(info.value).split("\n")[0])


def test_the_unmodified_object_loads(plan_obj, hetero_plan) -> None:
    assert plan_mod.from_dict(plan_obj).ratios == hetero_plan.ratios


def test_load_missing_file_and_invalid_json(tmp_path) -> None:
    with pytest.raises(TfplanError, match="^plan not found: "):
        plan_mod.load(tmp_path / "none.json")
    path = tmp_path / "bad.json"
    path.write_text('{"schema_version": 1,\n "schedule": }')
    with pytest.raises(TfplanError, match=r"bad\.json: invalid JSON at line 2, column 14"):
        plan_mod.load(path)


def test_plan_schema_version_true_is_rejected(plan_obj) -> None:
    with pytest.raises(TfplanError, match="^schema_version: must be 1, 2 or 3"):
        plan_mod.from_dict(plan_obj | {"schema_version": True})


def test_ratios_of_fixed_actions_are_rejected_on_load(plan_obj_v2) -> None:
    plan_obj_v2["actions"][0]["freeze_ratio"] = 0.5  # 0F0 cannot be frozen
    with pytest.raises(TfplanError, match="0F0 has freeze_ratio 0.5, but freezing cannot shorten it"):
        plan_mod.from_dict(plan_obj_v2)


def test_table_ratios_of_unfreezable_actions_are_rejected_on_load() -> None:
    # Version 3 lists only B and W actions; one whose frozen time equals its unfrozen time cannot be frozen.
    stiff = profile.uniform(2, name="stiff", backward_frozen_ms=2.0)
    d = dag_mod.build(schedules.generate("1f1b", 2, 4), stiff)
    obj = json.loads(json.dumps(plan_mod.to_dict(plan_mod.make_plan(d, solver.solve(d, 0.9), [0.9, 0.9], stiff))))
    assert obj["freeze_ratio"] == [[0.0] * 4] * 2
    obj["freeze_ratio"][1][2] = 0.5
    with pytest.raises(TfplanError, match=r"^freeze_ratio\[1\]\[2\]: 1B2 has freeze_ratio 0.5, but freezing cannot"):
        plan_mod.from_dict(obj)


def test_target_speedup_must_be_a_number(plan_obj) -> None:
    plan_obj["target_speedup"] = "fast"
    with pytest.raises(TfplanError, match="target_speedup: must be a number or null"):
        plan_mod.from_dict(plan_obj)


def _as_version_1(obj: dict) -> dict:
    """A version-3 plan object as tfplan wrote it before issue 9: per-action list, no gaps, no time limit."""
    obj = _as_version_2(obj) | {"schema_version": 1}
    obj["solver"].pop("time_limit_s")
    for phase in obj["solver"]["phases"]:
        phase.pop("gap")
    return obj


def test_version_1_plans_still_load(plan_obj, hetero_plan) -> None:
    old = _as_version_1(plan_obj)
    loaded = plan_mod.from_dict(old)
    assert loaded.ratios == hetero_plan.ratios
    assert loaded.solver.time_limit_s is None and all(p.gap is None for p in loaded.solver.phases)
    assert plan_mod.from_dict(old | {"solver": {}}).solver is None  # a version-1 plan not made by the LP
    assert plan_mod.from_dict(plan_obj | {"solver": None}).solver is None
    # A version-1 solver section lacking a key is a one-line error naming it, not a KeyError in `tfplan show`.
    del old["solver"]["wall_s"]
    with pytest.raises(TfplanError, match=r"^solver\.wall_s: missing required field"):
        plan_mod.from_dict(old)


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


# Provenance (issue 13) and hostile input


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


def test_plans_without_a_profile_source_still_load(plan_obj, hetero_plan) -> None:
    del plan_obj["profile"]["source"]
    assert plan_mod.from_dict(plan_obj).profile_source == {}
    assert plan_mod.from_dict(_as_version_1(plan_obj)).profile_source == {}


@pytest.mark.parametrize(("source", "message"), [
    ([1], r"^profile\.source: must be an object"),
    ({"model": ["tiny"]}, r"^profile\.source\.model: must be a string, number, boolean or null"),
    ({"seq_len": float("inf")}, r"^profile\.source\.seq_len: must be finite"),
    ({str(i): i for i in range(plan_mod.MAX_SOURCE_FIELDS + 1)}, r"^profile\.source: at most 64 fields"),
])
def test_a_bad_profile_source_names_the_field(plan_obj, source, message) -> None:
    plan_obj["profile"]["source"] = source
    with pytest.raises(TfplanError, match=message):
        plan_mod.from_dict(plan_obj)


def test_unreadable_plan_files_are_one_line(tmp_path) -> None:
    cases = {"binary.json": (b"\xff\xfe\x00" * 10, "not a UTF-8 text file"),
             "deep.json": (b"[" * 5000 + b"]" * 5000, "JSON nested too deeply")}
    for name, (data, message) in cases.items():
        (tmp_path / name).write_bytes(data)
        with pytest.raises(TfplanError, match=message):
            plan_mod.load(tmp_path / name)
    with pytest.raises(TfplanError, match="is a folder"):
        plan_mod.load(tmp_path)


def _small_plan_obj() -> dict:
    prof = profile.uniform(2, name="unit")
    d = dag_mod.build(schedules.generate("1f1b", 2, 4), prof)
    return json.loads(json.dumps(plan_mod.to_dict(plan_mod.make_plan(d, solver.solve(d, 0.9), [0.9, 0.9], prof))))


SMALL_PLAN = _small_plan_obj()


@settings(max_examples=300, deadline=None)
@given(mutated(SMALL_PLAN) | json_values)
def test_fuzzed_plans_raise_only_tfplan_errors(obj) -> None:
    try:
        plan_mod.from_dict(obj)
    except TfplanError as exc:
        assert str(exc).strip() and "\n" not in str(exc).split(":")[0]


def test_a_key_with_a_newline_stays_on_one_line() -> None:
    # found by the fuzzer above: an unknown key "\n" in solver.phases[2] split the error in two lines
    obj = json.loads(json.dumps(SMALL_PLAN))
    obj["solver"]["phases"][2]["\n"] = 1
    with pytest.raises(TfplanError) as info:
        plan_mod.from_dict(obj)
    assert str(info.value).startswith('solver.phases[2]."\\n": unknown field') and "\n" not in str(info.value)
