"""Greets each input using settings from the function's userConfig."""
from pulsar import Function


class GreetingFunction(Function):
    def process(self, input, context):
        greeting = context.get_user_config_value("greeting") or "Hello"
        times = int(context.get_user_config_value("times") or 1)
        return " ".join([f"{greeting}, {input}"] * times)
