"""A run's settings: what `tfrun train` validated, handed to every rank as run_config.json.

Read in this order:
  train_config.py   TrainConfig (plain data, one docstring per field) and its checks
  jsonfields.py     the type checks that read run_config.json back into it
"""
