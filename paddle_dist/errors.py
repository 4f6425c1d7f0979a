"""Errors a user can fix. Entry points print them as one line and exit with code 2."""



class UserError(Exception):
    """Bad input: a config, an option, a data file. The message says what and how to fix it.

    Example:
        raise UserError("train.epochs must be >= 1 (got 0); set -o train.epochs=5")
    """


class ConfigError(UserError):
    """A config file, key or value is wrong."""


class DataError(UserError):
    """A dataset is missing, incomplete or corrupted."""


class DeviceError(UserError):
    """Devices were asked for that this machine or Paddle build cannot give."""
