// Greets each input using settings from the function's userConfig.
function greet(input, context) {
  const greeting = context.getUserConfigValue('greeting') || 'Hello';
  const times = Number(context.getUserConfigValue('times') || 1);
  return Array(times).fill(greeting + ', ' + input).join(' ');
}
