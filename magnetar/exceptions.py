"""The root of every error Magnetar raises on purpose.

MagnetarError
 +-- BrokerError                      (magnetar.broker)
 +-- InstanceError                    (magnetar.instance.exceptions)
 |    +-- InvalidFunctionConfigError, FunctionLoadError, SerDeError, StateNotConfiguredError
 +-- WorkerError                      (magnetar.worker.exceptions)
 |    +-- WorkerConfigError, NotLeaderError, LeaderUnavailableError, FunctionExistsError,
 |        FunctionNotFoundError, PackageError, ReplicationTimeoutError, TriggerError,
 |        TriggerTimeoutError, AuthenticationError, AuthorizationError,
 |        BrokerAdminError (+-- BrokerAdminUnreachableError)
 +-- SparkConnectorError              (magnetar.spark_connector.exceptions)
 +-- ApachePulsarError                (magnetar.testing.exceptions)
"""


class MagnetarError(Exception):
    """Base class of all Magnetar errors; the message says what was wrong and what to do."""
