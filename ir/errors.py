"""Errors a user can act on. The CLI prints them without a traceback and exits with status 2."""


class McuforgeError(Exception):
    """Base class: the message says what is wrong and what to do."""


class ModelError(McuforgeError):
    """The model file cannot be read: corrupt, truncated, not a model, or uses what we lack."""


class UnsupportedOpError(ModelError):
    """The model uses operators mcuforge cannot compile; the message lists all of them."""


class BuildError(McuforgeError):
    """The generated C project failed to build or run."""


class ModelNote(UserWarning):
    """Something the compiler decided for the user (e.g. a dynamic batch set to 1): the CLI
    prints it as a note; the API raises it as a warning."""
