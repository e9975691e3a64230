"""One exception type for every user-facing failure.

The CLI turns a ``VseError`` into a single line ``error: <message>`` and exit code 1;
anything else is a bug and keeps its traceback.  Messages name the file and the problem.
"""


class VseError(Exception):
    """A problem with the user's input or environment, explained in one line."""

    def __init__(self, message: str, path=None):
        self.path = None if path is None else str(path)
        super().__init__(f"{self.path}: {message}" if self.path else message)
