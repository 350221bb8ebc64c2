"""Apache Pulsar's logging_function: logs a line for every input (to --log-topic if set)."""
from pulsar import Function


class LoggingFunction(Function):
    def process(self, input, context):
        logger = context.get_logger()
        logger.info("got %s from %s", input, context.get_current_message_topic_name())
        if "danger" in input:
            logger.warning("a dangerous input: %s", input)
        return input
