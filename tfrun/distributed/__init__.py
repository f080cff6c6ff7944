"""The pipeline machinery: stages, the schedule runtime, the launcher, and what every rank decides together.

Read in this order:
  runtime.py   the one module that touches torch.distributed.pipelining: stages, the schedule runtime fed with
               the plan's order, freezing and timing hooks per action (Note [freeze methods])
  tied.py      a tied embedding's two copies (first and last stage) kept one parameter
  rank.py      one rank assembled: its place in the (dp, pp) mesh, stages, freezer, runtime
  signals.py   graceful stops agreed by every rank after the same step (Note [graceful stop])
  launch.py    the job's ranks forked from the launcher (Note [forked ranks]), or an external torchrun joined
"""
