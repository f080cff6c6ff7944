"""`python -m tfrun` runs the tfrun command line (also under torchrun: `torchrun ... -m tfrun train ...`)."""

from tfrun.cli.app import main

main()
