"""User config: appends the value of the user config key "suffix"."""

from pulsar import Function


class Append(Function):
    def process(self, input, context):
        return input + context.get_user_config_value("suffix")
