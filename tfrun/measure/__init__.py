"""What a run measures about time, and the measured profile it writes for the next planning round.

Read in this order:
  timing.py      per-action start and end times on every rank, gathered to rank 0 (ActionTimer)
  wallclock.py   the run's wall time, step by step, evaluation excluded (Note [wall time])
  profile.py     metrics.jsonl, timings.json and the measured profile (Note [step overhead])
"""
