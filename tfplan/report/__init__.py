"""What a person (or a script) reads: the step and the plan drawn, sweeps, traces, and why a run missed.

Read in this order:
  render.py      a simulated step: summary table, rank timelines, gantt panels, the schedule grid
  plan_view.py   a plan: predicted step times against the baselines, ratios per stage, heat map, notes, JSON
  trace.py       a Chrome trace (Perfetto) of a step
  sweep.py       what-if sweeps over schedules, micro-batch counts and caps
  summary.py     the summary.json a tfrun run writes: its fields and validator
  explain.py     a run's measured actions lined up with its plan's predicted ones (`tfplan explain`)
"""
