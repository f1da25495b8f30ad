"""The one exception type of the runtime that reaches the user (exit code 2, one line)."""


class RunError(Exception):
    """A user-facing runtime error: one line, names the problem and the fix."""
