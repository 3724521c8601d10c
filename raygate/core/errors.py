"""The one exception type the CLI turns into a single clear line and a nonzero exit."""


class RaygateError(Exception):
    """A failure the user can act on; its message says what to change."""
