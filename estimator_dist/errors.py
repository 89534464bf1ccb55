"""Errors that end a run with a one-line message and a meaningful exit code."""

EXIT_OK = 0
EXIT_INTERNAL = 1
EXIT_USER = 2
EXIT_INTERRUPTED = 130


class UserError(Exception):
    """A mistake in what the user asked for: printed as one line, exit code 2."""

    exit_code = EXIT_USER
