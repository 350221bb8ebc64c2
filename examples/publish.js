// Republishes each input to the topic named by the 'publish-topic' user-config value,
// with a property, and returns nothing.
function process(input, context) {
  const topic = context.getUserConfigValue('publish-topic');
  context.publish(topic, input + '!', { source: context.getFunctionName() });
  context.recordMetric('published', 1);
  return null;
}
