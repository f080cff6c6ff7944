"""The freezing decisions: which tensors a (stage, micro-batch) action freezes, and how much, step by step.

Read in this order:
  candidates.py   a stage's tensors, what each costs (Note [freeze share]) and learns
  allocate.py     planned ratios turned into frozen sets over a window of steps (pure Python)
  freezing.py     the Freezer: policies (Note [freeze policy]), windows, the stale guard, what was realised
  noise_estimators.py  how measured steps combine into each tensor's and stage's estimate (Note [robust noise])
  noise.py        the gradient noise scale of every stage, measured from the step's micro-batch gradients
  noise_perseq.py      per-sequence gradient norms alongside the backward (Note [per-sequence norms])
  noise_reference.py   the noise scale by its definition at fixed weights, to check the above against
  baselines.py    APF and AutoFreeze, the methods people already use
  drift.py        the online mode's check that the plan's action times are still the run's (Note [drift])
  controller.py   the online goodput mode's decisions: gate, hysteresis, bound (Note [goodput controller])
  phases.py       the online mode's phases: which steps measure, which make the first profile (Note [goodput start])
  online.py       online TimelyFreeze: measure, probe, solve, freeze and re-plan inside the run
  replay.py       a recorded run's frozen sets, frozen again (`tfrun retime`)
"""
