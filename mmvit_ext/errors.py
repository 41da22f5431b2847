"""The one error type for settings we cannot honour (constructor arguments, whole configs)."""


class ConfigError(ValueError, AssertionError):
    """A setting we cannot honour, with the setting and what we support named. Also an
    ``AssertionError``: the peers assert on the same mistakes, so code written against them
    keeps catching it."""


__all__ = ['ConfigError']
