"""What a run leaves behind and what may be trusted in it.

Read in this order:
  checkpoint.py   checkpoints that a crash or a damaged file never turn into a wrong resume (Note [checkpoint
                  commit])
  provenance.py   what a run may trust: a plan's profile against the run, a resume against its checkpoint
  summarize.py    summary.json, for every kind of run
  tensorboard.py  `--tensorboard`: the metrics rows as TensorBoard scalars
  compare.py      `tfrun compare`: methods side by side at equal time
  export.py       `tfrun export`: a run's weights as a Hugging Face checkpoint
"""
