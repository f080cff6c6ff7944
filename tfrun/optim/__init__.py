"""The training recipe: the optimizer's settings, the learning rate's schedule, the global gradient norm (its
clipping and the check that a step is finite).

Read in this order:
  lr_schedule.py   constant, cosine, linear and warmup-stable-decay schedules, step by step as transformers'
  optimizer.py     AdamW with weight decay on tensors of two or more dimensions only
  clipping.py      the gradient norm over every stage and replica (one all-reduce a step), clipping, finiteness
"""
