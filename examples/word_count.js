// Counts every word of every sentence in the function's state, and answers with the
// running count of the sentence's first word.
function process(sentence, context) {
  const words = sentence.split(/\s+/).filter((word) => word.length > 0);
  for (const word of words) {
    context.incrCounter(word, 1);
  }
  return words.length ? words[0] + '=' + context.getCounter(words[0]) : null;
}
