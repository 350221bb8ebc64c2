// Throws for inputs containing 'boom', to show user exceptions, retries and dead letters;
// loops forever on 'hang', to show the time limit.
function process(input, context) {
  if (input.includes('boom')) {
    throw new Error('cannot handle ' + JSON.stringify(input));
  }
  while (input === 'hang') {}
  context.log('handled', input);
  return input.toUpperCase();
}
