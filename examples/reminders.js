// Timers in Couchbase Eventing's style: the handler arms and cancels timers with
// createTimer(callback, date, reference, context) and cancelTimer(callback, reference); a
// callback is a top-level function of the script, called with the context it was armed with,
// and what it returns is the output. Inputs are JSON commands (a JSON input SerDe):
//   {"arm": "r1", "at": <epoch s>, "note": "..."}   remind at "at" (re-arming replaces)
//   {"cancel": "r1"}                                cancel it
//   {"every": "tick", "seconds": 0.5, "times": 3}   a recurring reminder, fired 3 times

function process(input, context) {
  if (input.cancel !== undefined) {
    const wasPending = cancelTimer(remind, input.cancel);
    return JSON.stringify({ cancelled: input.cancel, was_pending: wasPending });
  }
  if (input.every !== undefined) {
    const every = { reference: input.every, seconds: input.seconds, left: input.times };
    createTimer(tick, new Date(Date.now() + input.seconds * 1000), input.every, every);
    return null;
  }
  createTimer(remind, new Date(input.at * 1000), input.arm, { reference: input.arm, note: input.note });
  return null;
}

function remind(context) {
  return JSON.stringify({ fired: context.reference, note: context.note, at: Date.now() / 1000 });
}

function tick(context) {
  const firedAt = Date.now();  // the next tick is due an interval after this one fired
  const left = context.left - 1;
  if (left > 0) {  // recurring: the callback arms the same reference again
    const again = Object.assign({}, context, { left: left });
    createTimer(tick, new Date(firedAt + context.seconds * 1000), context.reference, again);
  }
  return JSON.stringify({ fired: context.reference, left: left, at: firedAt / 1000 });
}
