"""A run's settings: what `tfrun train` validated, handed to every rank as run_config.json.

Read in this order:
  train_config.py   TrainConfig (plain data, one docstring per field)
  checks.py         its checks: every setting a user chooses, one clear line per problem
  jsonfields.py     the type checks that read run_config.json back into it
"""
