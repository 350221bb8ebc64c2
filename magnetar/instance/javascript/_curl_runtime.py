"""The JavaScript side of ``curl`` (see ``_curl``): evaluated in every context after the
prelude, the check's too, so it depends on nothing but the prelude's names."""

from __future__ import annotations

import json

from magnetar.instance.javascript._prelude import RUNTIME_GLOBAL, RUNTIME_SOURCE_URL

__all__ = ["CURL_RUNTIME", "FETCH_KIND", "METHODS"]

FETCH_KIND = "h"
"""The prelude's fetch kind of a request."""
METHODS = ("GET", "POST", "PUT", "HEAD", "DELETE", "PATCH")

CURL_RUNTIME = (
    r"""
(function (global) {
  'use strict';
  const stringify = JSON.stringify;
  const parse = JSON.parse;
  const METHODS = """
    + json.dumps(list(METHODS))
    + r""";
  const REQUEST_KEYS = ['path', 'params', 'headers', 'body', 'redirect'];
  const aliases = new Map(); // alias -> the binding's object (a global of the script too)
  let answers = null; // [message index, answers to its requests], sent by Python this call
  let calls = 0;
  let sequence = { call: -1, at: -1, next: 0, asked: null };

  class CurlError extends Error {}
  Object.defineProperty(CurlError.prototype, 'name', { value: 'CurlError' });

  const runtime = global."""
    + RUNTIME_GLOBAL
    + r""".extend('"""
    + FETCH_KIND
    + r"""', {
    bind(settings) {
      for (const alias of settings.urlBindings) {
        const binding = Object.freeze({ alias: alias });
        aliases.set(alias, binding);
        if (!(alias in global)) {
          Object.defineProperty(global, alias, { value: binding, writable: true,
                                                 configurable: true });
        }
      }
    },
    call() { calls++; answers = null; },
    fetched(at, list) { answers = [at, list]; },
  });

  function bindingName(binding) {
    const alias = typeof binding === 'string' ? binding
      : (binding !== null && typeof binding === 'object' ? binding.alias : undefined);
    if (typeof alias !== 'string' || !aliases.has(alias)) {
      const known = Array.from(aliases.keys()).join(', ') || 'none';
      throw new CurlError('curl: ' + (typeof alias === 'string' ? "'" + alias + "'" : 'that') +
                          ' is no URL binding of this function (bindings: ' + known + ')');
    }
    return alias;
  }

  function strings(what, value) {
    if (value === undefined || value === null) return {};
    if (typeof value !== 'object' || Array.isArray(value)) {
      throw new TypeError('curl: request.' + what + ' must be an object');
    }
    return value;
  }

  function request(method, binding, options) {
    if (typeof method !== 'string' || METHODS.indexOf(method.toUpperCase()) < 0) {
      throw new TypeError('curl: method must be one of ' + METHODS.join(', ') + ', got ' +
                          stringify(method));
    }
    const alias = bindingName(binding);
    const given = strings('request', options);
    for (const key of Object.keys(given)) {
      if (REQUEST_KEYS.indexOf(key) < 0) {
        throw new TypeError('curl: request has no field ' + key + ' (fields: ' +
                            REQUEST_KEYS.join(', ') + ')');
      }
    }
    const path = given.path === undefined ? '' : given.path;
    if (typeof path !== 'string') throw new TypeError('curl: request.path must be a string');
    const headers = {};
    for (const [name, value] of Object.entries(strings('headers', given.headers))) {
      if (typeof value !== 'string') {
        throw new TypeError('curl: header ' + name + ' must be a string');
      }
      headers[name] = value;
    }
    let body = null;
    let json = false;
    if (given.body !== undefined && given.body !== null) {
      json = typeof given.body !== 'string';
      body = json ? stringify(given.body) : given.body;
      if (body === undefined) throw new TypeError('curl: request.body has no JSON form');
    }
    return { method: method.toUpperCase(), binding: alias, path: path,
             params: strings('params', given.params), headers: headers, body: body,
             json: json, redirect: given.redirect === true };
  }

  function response(answer) {
    if (answer.error !== undefined) throw new CurlError(answer.error);
    let body = answer.body;
    if (answer.json) {
      try { body = parse(body); } catch (e) { /* a JSON type, not JSON: the text */ }
    }
    return { status: answer.status, headers: Object.assign({}, answer.headers), body: body };
  }

  global.CurlError = CurlError;
  global.curl = function curl(method, binding, options) {
    const at = runtime.message();
    if (at < 0) throw new Error('curl can only be called while processing a message');
    const spec = request(method, binding, options);
    if (sequence.call !== calls || sequence.at !== at) {
      sequence = { call: calls, at: at, next: 0, asked: null };
    }
    // the script caught the first unanswered call: the later ones wait for its answer
    if (sequence.asked !== null) return runtime.need(sequence.asked);
    const n = sequence.next++;
    if (answers !== null && answers[0] === at && n < answers[1].length) {
      return response(answers[1][n]);
    }
    sequence.asked = spec;
    return runtime.need(spec);
  };
})(globalThis);
//# sourceURL="""
    + RUNTIME_SOURCE_URL
    + "\n"
)
"""Evaluated after the prelude: ``curl`` and ``CurlError``, and each binding's alias as a
global (unless the script defines that name itself)."""
