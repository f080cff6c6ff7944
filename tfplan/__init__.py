"""tfplan: plan schedule-aware parameter freezing for pipeline-parallel training.

Pure Python (networkx, ortools, numpy, rich, typer); never imports torch (a layers contract in pyproject.toml
checks it, and that no folder imports one above it). The folders, in the order data flows through them:

  schedule/   the action grammar (torch's "2F0", "1W3") and the seven schedules, validated
  cost/       what an action costs: profiles (measured, analytic or given), the gradient noise and goodput model
  step/       one training step as a DAG of actions, and its exact timing (the simulator)
  solve/      the three-phase LP: what both backends share (lp), GLOP on the full LP (solver), fastlp
  plan/       the job that turns options into a plan, and the plan file tfrun reads
  report/     what a person reads: tables, timelines, traces, what-if sweeps, explanations of a run
  cli/        the `tfplan` command, thin typer commands over the folders above
errors.py (TfplanError) and fileio.py (atomic writes, JSON read with field paths) sit below them all.
"""

__version__ = "0.1.0"
