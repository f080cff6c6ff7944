"""`python -m tfplan` runs the tfplan command line."""

from tfplan.cli.app import main

main()
