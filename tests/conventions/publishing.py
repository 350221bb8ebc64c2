"""Publishing: sends to the topic in the user config "publish-topic", with properties, key
and event time in message_conf; returns nothing."""

from pulsar import Function


class Publish(Function):
    def process(self, input, context):
        context.publish(
            context.get_user_config_value("publish-topic"),
            input + "!",
            message_conf={
                "properties": {"input_topic": context.get_current_message_topic_name()},
                "partition_key": "k-" + input,
                "event_timestamp": 1234,
            },
        )
