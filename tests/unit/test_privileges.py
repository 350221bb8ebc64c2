"""What an instance process keeps of its worker's environment."""

from __future__ import annotations

from magnetar.instance.privileges import instance_environment


def test_the_workers_settings_and_pulsar_credentials_are_dropped() -> None:
    worker = {
        "PATH": "/usr/bin",
        "PYTHONPATH": "/src",
        "LANG": "C.UTF-8",
        "MAGNETAR_TOKEN_SECRET_KEY": "file:///etc/magnetar/secret.key",
        "MAGNETAR_AUTH_TOKEN": "eyJ...",
        "magnetar_superuser_roles": "admin",
        "PULSAR_AUTH_PARAMS": "token:eyJ...",
        "PULSAR_CLIENT_TOKEN": "eyJ...",
        "DB_PASSWORD": "for the function's environment secrets provider",
    }
    assert instance_environment(worker) == {
        "PATH": "/usr/bin",
        "PYTHONPATH": "/src",
        "LANG": "C.UTF-8",
        "DB_PASSWORD": "for the function's environment secrets provider",
    }
