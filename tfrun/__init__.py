"""tfrun: pipeline-parallel training on torch.distributed.pipelining with per-micro-batch freezing.

The folders, from what a run reads to how it starts (each imports only from those above it in this list; a
layers contract in pyproject.toml checks it):

  models/, data/  what a run trains and reads: our LLaMA, Hugging Face checkpoints, text and token sources
  optim/          the training recipe: AdamW's settings, learning-rate schedules, the global gradient norm
  config/         the run's settings (TrainConfig) and their JSON checks
  measure/        per-action timing, the run's wall clock, and the measured profile a run writes
  records/        what a run leaves: checkpoints, summaries, provenance, comparisons, exported weights
  freeze/         the freezing decisions: tensors and costs, policies and windows, baselines, noise scale,
                  the online mode and its drift checks
  distributed/    the pipeline machinery: the one module that touches torch.distributed.pipelining (runtime),
                  a rank's assembly, the launcher and the per-step agreement on stops
  train.py        the training loop of one rank; library.py, the freezer for a user's own loop
  retime.py       `tfrun retime`: recorded runs' steps run again side by side (Note [paired time])
  cli/            the `tfrun` command and each launched rank's worker
errors.py (TfrunError) sits below them all.
"""
