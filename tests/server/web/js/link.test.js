// The shareable link: what it holds, read strictly.

import { test } from 'node:test';
import assert from 'node:assert/strict';
import { formatLink, parseLink } from '../../../../src/corral/server/web/link.js';

test('a link round-trips an episode', () => {
  const ep = { seed: 7, options: { max_guesses: 3 }, actions: [{ guess: 'crane' }, { guess: "it's \"quoted\" & #" }] };
  assert.deepEqual(parseLink(`#${formatLink(ep)}`), ep);
  assert.deepEqual(parseLink(formatLink({ seed: null, options: {}, actions: [] })), { seed: null, options: {}, actions: [] });
});

test('a fragment without an episode is none', () => {
  assert.equal(parseLink(''), null);
  assert.equal(parseLink('#theme=dark'), null);
});

test('a malformed link is an error to show, never a replay', () => {
  for (const [fragment, why] of [
    ['#actions=[{', /readable JSON/],
    ['#actions={"a":1}', /not a JSON list/],
    ['#seed=1&options=[1]&actions=[]', /not a JSON object/],
    ['#seed=1e3&actions=[]', /not a whole number/],
    ['#seed=-1&actions=[]', /not a whole number/],
    ['#seed=99999999999999999999&actions=[]', /not a whole number/],
  ]) {
    const parsed = parseLink(fragment);
    assert.match(parsed.error, why, fragment);
    assert.equal(parsed.actions, undefined);
  }
});
