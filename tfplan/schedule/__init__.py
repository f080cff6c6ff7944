"""The action grammar and the seven schedules, as plain data (torch.distributed.pipelining's own grammar).

Read in this order:
  actions.py       an action ("2F0", "1W3") parsed and printed, the compute kinds
  validate.py      the validator every schedule passes before it is used (the rank x step grid, bad cell marked)
  schedules.py     GPipe, 1F1B, interleaved 1F1B, looped BFS, interleaved zero-bubble, and CSV in and out
  schedules_v.py   the V-shaped ones (ZBV, DualPipeV), rank r holding stages r and 2P-1-r
"""
