"""What an action costs: in time (profiles, measured or analytic) and in learning (the noise and goodput model).

Read in this order:
  goodput.py       the learning model: gradient noise scale, statistical efficiency, goodput (Note [goodput model])
  profile.py       the profile file: per stage or per layer, action times in ms, the noise section
  layers.py        a per-layer profile split into the schedule's stages (Note [layer partition])
  hardware.py      the catalogue of model shapes, GPUs and links the analytic model knows
  costmodel.py     the analytic cost model: per-layer times from FLOPs and bytes
  dataparallel.py  the gradient reduction of data-parallel replicas, added to each rank's tail
  measured.py      a measured profile, by running tfrun's executor in a subprocess
"""
