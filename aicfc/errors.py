"""The one exception type that reaches the user.

Anything the user can cause (a bad model, a bad flag, a corrupt bundle, a missing tool) raises
`AicfError` with a one-line message that names the problem and what to do. The CLI prints it
as `aicfc: error: <message>` and exits with code 2. Any other exception is a compiler bug.
"""


class AicfError(Exception):
    """A user-facing error: one line, names the problem and the fix."""
