"""The one error type every loader and validator raises for bad input.

It lives in the lowest package so that ``simulator`` and ``autoplan`` can share it
without breaking the layering (imports go down only). The CLI turns it into a
one-line ``autoplan: error: ...`` message and exit code 2.
"""


class InputError(ValueError):
    """Bad user input: a file, key or value that cannot be used. The message is one line."""

    def __init__(self, message: str):
        super().__init__(" ".join(str(message).split()))
