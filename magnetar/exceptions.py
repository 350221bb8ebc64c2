"""The root of every error Magnetar raises on purpose.

MagnetarError
 +-- BrokerError                      (magnetar.broker)
 +-- InstanceError                    (magnetar.instance.exceptions)
      +-- InvalidFunctionConfigError
      +-- FunctionLoadError
      +-- SerDeError
      +-- StateNotConfiguredError
"""


class MagnetarError(Exception):
    """Base class of all Magnetar errors; the message says what was wrong and what to do."""
