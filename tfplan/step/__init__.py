"""One training step as a graph of actions, and its exact timing.

Read in this order:
  dag.py        the DAG: every action with its unfrozen and fully frozen duration, edges with their lags
                (METHOD.md section 2; Note [freeze groups])
  simulate.py   earliest start times for given durations: makespan, bubbles, critical path
"""
