"""Chrome trace event JSON (one track per rank) that opens in Perfetto or chrome://tracing."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from tfplan.step.dag import Dag
from tfplan.step.simulate import Simulation


def chrome_trace(dag: Dag, sim: Simulation, ratios: Sequence[float] | None = None, name: str = "") -> dict[str, Any]:
    """Complete ("X") events in microseconds, pid 0, tid = rank; args carry stage, micro-batch and ratio."""
    events: list[dict[str, Any]] = [
        {"ph": "M", "name": "process_name", "pid": 0, "args": {"name": name or dag.schedule.name}},
    ]
    for r in range(dag.schedule.num_ranks):
        events.append({"ph": "M", "name": "thread_name", "pid": 0, "tid": r, "args": {"name": f"rank {r}"}})
        events.append({"ph": "M", "name": "thread_sort_index", "pid": 0, "tid": r, "args": {"sort_index": r}})
    for v, a in enumerate(dag.actions):
        args: dict[str, Any] = {"stage": a.stage, "microbatch": a.mb, "kind": a.kind}
        if ratios is not None and dag.freezable[v]:
            args["freeze_ratio"] = ratios[v]
        events.append(
            {
                "ph": "X",
                "name": str(a),
                "cat": a.kind,
                "pid": 0,
                "tid": dag.rank[v],
                "ts": sim.start_ms[v] * 1000.0,
                "dur": (sim.end_ms[v] - sim.start_ms[v]) * 1000.0,
                "args": args,
            }
        )
    return {"traceEvents": events, "displayTimeUnit": "ms"}
