"""`magnetar tokens ...`: make the keys and tokens of the admin API's token authentication
(as `pulsar tokens` does for Apache Pulsar)."""

from __future__ import annotations

import base64
import os
import re
import secrets
from pathlib import Path

import click

from magnetar.exceptions import MagnetarError
from magnetar.worker.auth import create_token, read_key

__all__ = ["tokens"]

_SECRET_KEY_BYTES = 32
_DURATION = re.compile(r"^(\d+)([smhdwy])$")
_UNIT_S = {"s": 1, "m": 60, "h": 3600, "d": 86400, "w": 604800, "y": 31536000}


@click.group()
def tokens() -> None:
    """Create secret keys and tokens for the workers' token authentication."""


@tokens.command("create-secret-key")
@click.option(
    "--output",
    "output_file",
    type=click.Path(dir_okay=False),
    help="Write the key to this file [default: print it in base64].",
)
@click.option("--base64", "as_base64", is_flag=True, help="Write the file in base64.")
def create_secret_key(output_file: str | None, as_base64: bool) -> None:
    """A new random HS256 secret key; give it to workers as token_secret_key.

    \b
    Example:
      magnetar tokens create-secret-key --output my-secret.key
    """
    key = secrets.token_bytes(_SECRET_KEY_BYTES)
    if output_file is None:
        click.echo(base64.b64encode(key).decode())
        return
    path = Path(output_file)
    # created unreadable to others from the start (a chmod after writing leaves a window)
    descriptor = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    with os.fdopen(descriptor, "wb") as file:
        os.fchmod(file.fileno(), 0o600)  # an existing file keeps its mode otherwise
        file.write(base64.b64encode(key) if as_base64 else key)
    click.echo(f"Wrote a secret key to {path} (workers: token_secret_key: file://{path.resolve()})")


@tokens.command()
@click.option(
    "--secret-key",
    required=True,
    help="The secret key: file:///path, data:;base64,<key>, a path or base64.",
)
@click.option("--subject", required=True, help="The role the token stands for.")
@click.option("--expiry-time", help="Lifetime such as 30m, 12h, 7d or 1y [default: none].")
def create(secret_key: str, subject: str, expiry_time: str | None) -> None:
    """A token for a role, signed with the secret key.

    \b
    Example:
      magnetar tokens create --secret-key file:///etc/magnetar/secret.key --subject admin
    """
    lifetime = _duration(expiry_time) if expiry_time else None
    try:
        key = read_key(secret_key)
    except MagnetarError as error:
        raise click.BadParameter(str(error), param_hint="'--secret-key'") from None
    click.echo(create_token(key, subject, lifetime))


def _duration(text: str) -> float:
    match = _DURATION.match(text.strip())
    if match is None:
        raise click.BadParameter(
            f"{text!r} is not a duration such as 30m, 12h, 7d or 1y", param_hint="'--expiry-time'"
        )
    return int(match[1]) * _UNIT_S[match[2]]
