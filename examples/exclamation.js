// The exclamation function in JavaScript: appends '!' to every input.
function process(input, context) {
  return input + '!';
}
