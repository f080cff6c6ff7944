"""The `tfrun` command, and what runs in each launched rank.

Read in this order:
  setup.py       the user's options and plan file turned into a validated TrainConfig, before any rank starts
  config_file.py `--config run.toml` and the resolved OUT/config.toml a run writes (Note [config precedence])
  train_options.py  every `tfrun train` option, declared once (flag, TOML key, panel, help, setting)
  train_cmd.py   `tfrun train`, built from that table
  profiling.py   `tfrun profile`: the measuring runs behind `tfplan profile`
  app.py         the app: `train`, `compare`, `profile`, `export`, main()
  worker.py      one rank's main (forked by tfrun.distributed.launch, or `python -m tfrun.cli.worker CONFIG.json`)
"""
