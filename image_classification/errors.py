"""The one error type a user can cause, turned into one line on stderr and exit code 2."""


class UserError(Exception):
    """A mistake in the user's input (flags, dataset, weights file), explained in one sentence."""
