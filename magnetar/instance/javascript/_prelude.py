"""The JavaScript half of the executor: evaluated in each V8 context before the user's script.

It defines ``__magnetar_runtime__`` (not writable, not configurable), whose ``bind`` takes the
user's function and the instance's settings, and whose ``run`` processes a batch of inputs
in one call into V8. V8 cannot call back into Python synchronously, so the context records
what a message does (publish, log, metrics, state writes, ack) as *effects* that Python
applies after the call, in order. State reads are served from a per-batch cache of values
Python read from the state store; a read the cache cannot answer stops the batch at that
message (its effects dropped) and names the key, and Python resumes the batch at that
message once it has applied the effects before it and read the key.

Wire format (JSON), one input: ``[text|null, parseJson]``; its metadata, sent only once the
function asks for some (``need: ["m", ""]``): ``[topic, messageId, key|null, eventTime,
properties]``. One result: ``output|null`` (success without effects), ``[0, output|null,
effects]`` (success), ``[1, error, logEffects]`` (user exception), ``[2, reason]``
(undecodable input). A call, ``run(callId, start, fetched, batch|null, metadata|null,
forgetState)`` (``runPacked`` with those as the JSON array ``this``), answers ``{call, r:
results, next, need?}``: results of the inputs from ``start`` to ``next``, and what to fetch
(a state key, or the metadata), if anything.
Effects: ``["p", topic, payload, properties|null]``, ``["i", key, amount]``, ``["d", key]``,
``["s", key, text]``, ``["l", level, text]``, ``["m", name, value]``, ``["a"]``, and the
timers' ``["t", callback, due ms, reference, context JSON]`` and ``["x", reference]``. A
timer's firing is an input ``[context JSON, true, callback]``: the script's top-level
``callback(context)`` is called instead of the function.
"""

from __future__ import annotations

__all__ = ["PRELUDE", "RUNTIME_GLOBAL", "RUNTIME_SOURCE_URL"]

RUNTIME_GLOBAL = "__magnetar_runtime__"
RUNTIME_SOURCE_URL = "magnetar-runtime.js"

PRELUDE = (
    r"""
(function (global) {
  'use strict';
  const OUR_CALL = /^\s*at .*<anonymous>:\d+:\d+\)?$/;
  // thrown when Python must fetch something first (a state key, the metadata)
  const NEEDS_FETCH = Object.freeze({ toString: () => 'waiting for Magnetar' });
  const MAX_INT = Number.MAX_SAFE_INTEGER;
  // the script may replace JSON's methods; the runtime keeps the originals
  const stringify = JSON.stringify;
  const parse = JSON.parse;

  let fn = null;
  let settings = null;
  let userConfig = null;
  let inputs = [];
  let metadata = null; // of the batch's inputs, once the function wants it
  let call = -1;
  let results = [];
  let reply = null;
  let current = -1;
  let effects = null;
  let needKey = null;
  let orphanLogs = [];
  const modules = new Map(); // fetch kind -> hooks of a runtime module (see extend)
  const counters = new Map();   // per batch: counter values known to equal the store's
  const values = new Map();
  const ownCounters = new Map(); // the current message's writes: {base, delta}
  const ownValues = new Map();

  function deepFreeze(value) {
    if (value && typeof value === 'object' && !Object.isFrozen(value)) {
      Object.freeze(value);
      for (const key of Object.keys(value)) deepFreeze(value[key]);
    }
    return value;
  }

  function text(value) {
    if (typeof value === 'string') return value;
    if (value instanceof Error) return value.stack || String(value);
    try {
      const json = stringify(value);
      return json === undefined ? String(value) : json;
    } catch (e) {
      return String(value);
    }
  }

  function log(level, args) {
    const line = Array.prototype.map.call(args, text).join(' ');
    (effects || orphanLogs).push(['l', level, line]);
  }

  function encode(value, json, what) {
    if (value === undefined || value === null) return null;
    if (!json && typeof value === 'string') return value;
    if (value instanceof Promise) {
      throw new TypeError(what + ' is a Promise: async functions are not supported, ' +
                          'return the value itself');
    }
    if (typeof value === 'function' || typeof value === 'symbol' || typeof value === 'bigint') {
      throw new TypeError(what + ' is a ' + typeof value + ', which has no JSON form');
    }
    return stringify(value);
  }

  function checkKey(method, key) {
    if (typeof key !== 'string' || key === '') {
      throw new TypeError(method + ' needs a non-empty string key, got ' + text(key));
    }
    if (!settings.stateEnabled) throw new Error(settings.stateError);
  }

  function inMessage(method) {
    if (effects === null) {
      throw new Error('context.' + method + ' can only be called while processing a message');
    }
  }

  function counterEntry(key) {
    let entry = ownCounters.get(key);
    if (entry === undefined) {
      entry = { base: counters.get(key), delta: 0 };
      ownCounters.set(key, entry);
    }
    return entry;
  }

  function need(kind, key) {
    needKey = [kind, key];
    throw NEEDS_FETCH;
  }

  function meta(method, field) {
    inMessage(method);
    if (metadata === null) need('m', '');
    return metadata[current][field];
  }

  const context = Object.freeze({
    getMessageId: () => meta('getMessageId', 1),
    getMessageKey: () => meta('getMessageKey', 2),
    getMessageEventTime: () => meta('getMessageEventTime', 3),
    getMessageProperties: () => Object.assign({}, meta('getMessageProperties', 4)),
    getCurrentMessageTopicName: () => meta('getCurrentMessageTopicName', 0),
    getFunctionName: () => settings.name,
    getFunctionTenant: () => settings.tenant,
    getFunctionNamespace: () => settings.namespace,
    getFunctionId: () => settings.tenant + '/' + settings.namespace + '/' + settings.name,
    getInstanceId: () => settings.instanceId,
    getInputTopics: () => settings.inputTopics.slice(),
    getOutputTopic: () => settings.outputTopic,
    getUserConfigValue: (key) => (Object.prototype.hasOwnProperty.call(userConfig, key)
      ? userConfig[key] : null),
    getUserConfigMap: () => userConfig,
    getSecret: (name) => (Object.prototype.hasOwnProperty.call(settings.secrets, name)
      ? settings.secrets[name] : null),
    log: function () { log('INFO', arguments); },
    recordMetric(name, value) {
      inMessage('recordMetric');
      if (typeof name !== 'string' || typeof value !== 'number' || !Number.isFinite(value)) {
        throw new TypeError('recordMetric(name, value) needs a string and a finite number');
      }
      effects.push(['m', name, value]);
    },
    publish(topic, value, properties) {
      inMessage('publish');
      if (typeof topic !== 'string' || topic === '') {
        throw new TypeError('publish needs a topic name, got ' + text(topic));
      }
      const payload = encode(value, false, 'the published value');
      if (payload === null) throw new TypeError('publish needs a value, got ' + value);
      let props = null;
      if (properties !== undefined && properties !== null) {
        props = {};
        for (const [name, v] of Object.entries(properties)) {
          if (typeof v !== 'string') {
            throw new TypeError('publish properties must be strings; ' + name + ' is ' + text(v));
          }
          props[name] = v;
        }
      }
      effects.push(['p', topic, payload, props]);
    },
    ack() {
      inMessage('ack');
      effects.push(['a']);
    },
    incrCounter(key, amount) {
      inMessage('incrCounter');
      checkKey('incrCounter', key);
      if (!Number.isSafeInteger(amount)) {
        throw new TypeError('incrCounter(' + key + ', amount) needs an integer amount between ' +
                            -MAX_INT + ' and ' + MAX_INT + ', got ' + text(amount));
      }
      counterEntry(key).delta += amount;
      effects.push(['i', key, amount]);
    },
    getCounter(key) {
      inMessage('getCounter');
      checkKey('getCounter', key);
      const entry = ownCounters.get(key);
      const base = entry === undefined ? counters.get(key) : entry.base;
      if (base === undefined) need('c', key);
      return base + (entry === undefined ? 0 : entry.delta);
    },
    delCounter(key) {
      inMessage('delCounter');
      checkKey('delCounter', key);
      ownCounters.set(key, { base: 0, delta: 0 });
      ownValues.set(key, null);
      effects.push(['d', key]);
    },
    putState(key, value) {
      inMessage('putState');
      checkKey('putState', key);
      if (typeof value !== 'string') {
        throw new TypeError('putState(' + key + ', value) needs a string value ' +
                            '(JSON.stringify objects), got ' + typeof value);
      }
      ownValues.set(key, value);
      effects.push(['s', key, value]);
    },
    getState(key) {
      inMessage('getState');
      checkKey('getState', key);
      if (ownValues.has(key)) return ownValues.get(key);
      if (!values.has(key)) need('v', key);
      return values.get(key);
    },
  });

  // Couchbase Eventing's timers: createTimer(callback, date, reference, context) arms a
  // timer (effect ["t", callback name, due ms, reference, context JSON]); cancelTimer
  // (callback, reference) cancels one (["x", reference]) and says whether one was pending,
  // which it reads like a state key (the key the Python side keeps the timer under).
  const TIMER_KEY = '\u0000timer/ref/';

  function timerReference(method, reference) {
    inMessage(method);
    if (typeof reference !== 'string' || reference === '') {
      throw new TypeError(method + ' needs a non-empty string reference, got ' + text(reference));
    }
    if (!settings.stateEnabled) throw new Error(settings.stateError);
    return TIMER_KEY + reference;
  }

  global.createTimer = function createTimer(callback, date, reference, timerContext) {
    const key = timerReference('createTimer', reference);
    if (typeof callback !== 'function' || !callback.name || global[callback.name] !== callback) {
      throw new TypeError('createTimer needs a top-level function of the script as its ' +
                          'callback, got ' + text(callback));
    }
    const due = date instanceof Date ? date.getTime() : date;
    if (typeof due !== 'number' || !Number.isFinite(due)) {
      throw new TypeError('createTimer needs a Date (or epoch milliseconds), got ' + text(date));
    }
    let payload;
    try {
      payload = stringify(timerContext === undefined ? null : timerContext);
    } catch (e) {
      throw new TypeError('the context of timer ' + reference + ' has no JSON form: ' + e.message);
    }
    if (payload === undefined) {
      throw new TypeError('the context of timer ' + reference + ' has no JSON form');
    }
    ownValues.set(key, payload);
    effects.push(['t', callback.name, due, reference, payload]);
    return reference;
  };

  global.cancelTimer = function cancelTimer(callback, reference) {
    const key = timerReference('cancelTimer', reference);
    let pending;
    if (ownValues.has(key)) pending = ownValues.get(key);
    else if (!values.has(key)) need('v', key);
    else pending = values.get(key);
    ownValues.set(key, null);
    effects.push(['x', reference]);
    return pending !== null && pending !== undefined;
  };

  function timerCallback(name) {
    const callback = global[name];
    if (typeof callback !== 'function') {
      throw new TypeError('the timer callback ' + name + ' is not a top-level function of ' +
                          'the script');
    }
    return callback;
  }

  // The message succeeded: its writes become what the cache knows of the store.
  function commit() {
    for (const [key, entry] of ownCounters) {
      if (entry.base !== undefined) counters.set(key, entry.base + entry.delta);
    }
    for (const [key, value] of ownValues) values.set(key, value);
  }

  function describe(error) {
    if (error instanceof Error && typeof error.stack === 'string') {
      // our own frames (the runtime, the code that called it) say nothing to the user
      return error.stack.split('\n')
        .filter((line) => line.indexOf('"""
    + RUNTIME_SOURCE_URL
    + r"""') < 0 && !OUR_CALL.test(line)).join('\n');
    }
    return 'Uncaught ' + text(error);
  }

  function runOne(input) {
    if (effects === null || effects.length) effects = [];
    if (ownCounters.size) ownCounters.clear();
    if (ownValues.size) ownValues.clear();
    needKey = null;
    let value = input[0];
    if (value === null) return [2, 'the payload is not UTF-8 text'];
    if (input[1]) {
      try {
        value = parse(value);
      } catch (e) {
        return [2, 'the payload is not JSON: ' + e.message];
      }
    }
    let output;
    try {
      // a timer's firing: [context JSON, true, callback name], called as callback(context)
      const result = input.length > 2 ? timerCallback(input[2])(value) : fn(value, context);
      output = encode(result, settings.outputJson, 'the returned value');
    } catch (e) {
      if (needKey !== null) return NEEDS_FETCH;
      return [1, describe(e), effects.filter((effect) => effect[0] === 'l')];
    }
    if (needKey !== null) return NEEDS_FETCH; // the function caught the cache miss
    if (ownCounters.size || ownValues.size) commit();
    return effects.length ? [0, output, effects] : output; // an empty one is used again
  }

  function finish(next, extra) {
    reply = Object.assign({ call: call, r: results, next: next }, extra);
    current = -1;
    effects = null;
    return stringify(reply);
  }

  const runtime = Object.freeze({
    bind(userFunction, instanceSettings) {
      fn = userFunction;
      settings = deepFreeze(instanceSettings);
      userConfig = settings.userConfig;
      for (const hooks of modules.values()) hooks.bind(settings);
      const logs = orphanLogs;
      orphanLogs = [];
      return stringify(logs);
    },
    run(callId, start, fetched, batch, batchMetadata, forget) {
      if (batch !== null) inputs = batch;
      if (batch !== null || batchMetadata !== null) metadata = batchMetadata;
      if (batch !== null || forget) {
        counters.clear();
        values.clear();
      }
      for (const hooks of modules.values()) hooks.call();
      for (const [kind, key, value] of fetched) {
        if (modules.has(kind)) modules.get(kind).fetched(key, value);
        else (kind === 'c' ? counters : values).set(key, value);
      }
      results = [];
      reply = null;
      call = callId; // last: a call stopped before this line reports the previous call
      for (let i = start; i < inputs.length; i++) {
        current = i;
        const result = runOne(inputs[i]);
        if (result === NEEDS_FETCH) return finish(i, { need: needKey });
        results.push(result);
        if (settings.stopOnError && Array.isArray(result) && result[0] !== 0) {
          return finish(i + 1, {});
        }
      }
      return finish(inputs.length, {});
    },
    // run's arguments as the JSON array ``this``: Python calls this function, compiled once,
    // where a call's own source would be compiled anew for each call
    runPacked() {
      const a = parse(this);
      return runtime.run(a[0], a[1], a[2], a[3], a[4], a[5]);
    },
    // After V8 stopped a call (timeout, memory): which call it was, what it had done and
    // where it was (a call stopped before it started reports the previous call).
    recover() {
      if (reply !== null) return stringify(reply);
      const logs = effects === null ? [] : effects.filter((effect) => effect[0] === 'l');
      const state = { call: call, r: results, at: current, logs: logs };
      results = [];
      current = -1;
      effects = null;
      return stringify(state);
    },
    // A runtime module evaluated after the prelude (curl) adds a kind of fetch. Its hooks:
    // bind(settings), call() at each call, fetched(key, value) for what Python sent it.
    extend(kind, hooks) {
      if (modules.has(kind) || ['c', 'v', 'm'].includes(kind) || fn !== null) {
        throw new Error('the runtime cannot be extended with ' + kind + ' now');
      }
      modules.set(kind, hooks);
      return Object.freeze({
        need: (key) => need(kind, key),
        message: () => (effects === null ? -1 : current), // the message being processed
      });
    },
  });

  Object.defineProperty(global, '"""
    + RUNTIME_GLOBAL
    + r"""', { value: runtime });
  const consoleLog = (level) => function () { log(level, arguments); };
  global.console = Object.freeze({
    log: consoleLog('INFO'), info: consoleLog('INFO'), debug: consoleLog('DEBUG'),
    warn: consoleLog('WARNING'), error: consoleLog('ERROR'),
  });
  // Timers would run outside any message: a function runs synchronously, message by message
  // (createTimer runs code later, durably).
  const noTimers = function () {
    throw new Error('setTimeout/setInterval are not available: a function processes each ' +
                    'message synchronously; use createTimer(callback, date, reference, context)');
  };
  global.setTimeout = noTimers;
  global.setInterval = noTimers;
  global.clearTimeout = noTimers;
})(globalThis);
//# sourceURL="""
    + RUNTIME_SOURCE_URL
    + "\n"
)
