"""The package's one error class for user mistakes (bad files, bad options).

The CLI catches it and prints one red line with exit code 1; internal invariants use `assert`.
"""


class TfplanError(ValueError):
    """A problem with the user's input: a bad file, option or combination. The message is one line,
    optionally followed by detail lines (for example a schedule grid with the bad cell marked)."""
