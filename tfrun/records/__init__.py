"""What a run leaves behind and what may be trusted in it.

Read in this order:
  checkpoint.py   checkpoints that a crash or a damaged file never turn into a wrong resume (Note [checkpoint
                  commit])
  checkpoint_choice.py  reading their indexes and choosing the one a resume starts from (Note [checkpoint
                  choice])
  provenance.py   what a run may trust: a plan's profile against the run, a resume against its checkpoint
  summarize.py    summary.json, for every kind of run
  tensorboard.py  `--tensorboard`: the metrics rows as TensorBoard scalars
  frozen_sets.py  frozen_sets.jsonl: what every action of every step froze (for `tfrun retime`)
  paired.py       the gap at equal time on the time axis `tfrun retime` measured side by side
  efficiency.py   learning efficiency from loss curves: unfrozen steps to the same eval loss over a run's steps
  compare.py      `tfrun compare`: methods side by side at equal time (and, --paired, on that axis)
  export.py       `tfrun export`: a run's weights as a Hugging Face checkpoint
"""
