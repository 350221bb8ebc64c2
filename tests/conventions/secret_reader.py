"""Secrets: returns the secret "username" (Apache's secrets_function convention)."""

from pulsar import Function


class Secret(Function):
    def process(self, input, context):
        return f"{context.get_secret('username')}!"
