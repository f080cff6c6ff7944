"""The TimelyFreeze LP: one model, two backends, certified optima.

Read in this order:
  lp.py       the three-phase LP (Note [three-phase LP]) and what both backends share: results, tolerances, the
              cap and time-limit checks, the certificate (Note [LP certificate])
  solver.py   OR-Tools GLOP on the full LP: the reference backend
  fastlp/     periodic compression, exact to a certified gap, for plans at cluster scale (its own docstring
              gives its files in order)
  heap.py     the process's memory settings for million-action jobs (Note [first touches])
"""
