"""tfrun's error class for user mistakes (bad plan, model, data or options); the CLI prints one line, exit 1."""


class TfrunError(ValueError):
    """A problem the user can fix. The message is one line."""
