"""Apache Pulsar's publish_function: republishes each input to the topic named by the
'publish-topic' user-config value, with a property."""
from pulsar import Function


class PublishFunction(Function):
    def process(self, input, context):
        topic = context.get_user_config_value("publish-topic")
        context.publish(topic, input + "!", properties={"source": context.get_function_name()})
        return None
