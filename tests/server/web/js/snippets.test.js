// Code written from episode data: literals only (tests/server/web/test_web_snippets.py
// also reads pyLiteral's output with Python's own parser, on generated values).

import { test } from 'node:test';
import assert from 'node:assert/strict';
import { pyString, pyLiteral, shellQuote, pythonSnippet, curlSnippet } from '../../../../src/corral/server/web/snippets.js';

test('Python strings are ASCII literals with every quote and control escaped', () => {
  assert.equal(pyString('a"b\\c'), '"a\\"b\\\\c"');
  assert.equal(pyString("'''#\nimport os"), '"\'\'\'#\\nimport os"');
  assert.equal(pyString('é\u2028😀\u0000'), '"\\xe9\\u2028\\U0001f600\\x00"');
  assert.equal(pyString('\ud800'), '"\\ud800"');
});

test('Python literals keep the JSON value, true inside a string included', () => {
  assert.equal(pyLiteral({ a: [true, false, null, 1.5, -0], 'b"': 'true' }), '{"a": [True, False, None, 1.5, -0.0], "b\\"": "true"}');
  assert.equal(pyLiteral(Infinity), 'float("inf")');
  assert.throws(() => pyLiteral(() => 1), TypeError);
});

test('shell words are single-quoted', () => {
  assert.equal(shellQuote("it's $(rm -rf x)"), "'it'\\''s $(rm -rf x)'");
});

test('snippets put data in literals only', () => {
  const hostile = 'http://127.0.0.1:1/a"b\'$(touch x)`id`';
  const ep = { seed: 1, options: { mode: '"); import os #' }, steps: [{ kind: 'reset' }, { kind: 'step', action: { guess: "'''\"\"\"" } }] };
  const python = pythonSnippet(ep, 1, { url: hostile });
  assert.ok(python.includes(`AsyncEnvClient(${pyString(hostile)}, codec="json")`));
  assert.ok(python.includes(`**{"mode": ${pyString('"); import os #')}}`));
  const curl = curlSnippet(ep, 1, { url: hostile });
  assert.ok(curl.includes(shellQuote(`${hostile}/reset`)));
  assert.ok(!curl.includes(` ${hostile}/`)); // never bare
});

test('whole numbers past 2^53 stay the same float in Python', () => {
  assert.equal(pyLiteral(2.183552306281477e16), '2.183552306281477e+16');
  assert.equal(pyLiteral(9007199254740991), '9007199254740991');
});
