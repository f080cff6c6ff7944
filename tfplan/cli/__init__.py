"""The `tfplan` command: thin typer commands that parse, call one library function and render.

Read in this order:
  options.py     the options the commands share, their parsers, the output console, and user errors as one line
  schedules.py   `simulate`, `schedules`, `show-schedule`
  plans.py       `solve`, `show`, `whatif`
  runs.py        `profile` (measured or analytic) and `explain`
  app.py         the app: the commands in --help's order, logging, the process's memory settings, main()
"""
