"""`python -m tfplan` runs the tfplan command line."""

from tfplan.cli import main

main()
