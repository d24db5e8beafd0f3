// The episode file format as the page writes and reads it (the Python side is
// tests/server/web/test_web_episodes.py, through a browser).

import { test } from 'node:test';
import assert from 'node:assert/strict';
import { toJsonl, fromJsonl, describe, FORMAT } from '../../../../src/corral/server/web/episode.js';

const meta = { env: 'wordle', contract_version: '1.0.0', fingerprint: 'sha256:abc', url: 'http://127.0.0.1:1', session: 's1', server: { version: '0.1' } };
const step = (fields) => ({ kind: 'step', action: null, observation: {}, reward: 0, terminated: false, truncated: false, ms: 1, t: 1000, error: null, state: null, ...fields });

const episode = (id, seed) => ({
  episode: id,
  seed,
  options: {},
  steps: [
    step({ kind: 'reset', observation: { guess: '' } }),
    step({ action: { guess: 'crane' }, observation: { guess: 'crane' }, reward: 0.5 }),
    step({ action: { guess: 'abc' }, observation: null, error: { code: 'INVALID_ACTION', message: 'no', details: {} } }),
  ],
});

test('an episode round-trips, failed steps included', () => {
  const [back] = fromJsonl(toJsonl(episode('e1', 3), meta));
  assert.equal(back.episode, 'e1');
  assert.equal(back.seed, 3);
  assert.equal(back.steps.length, 3);
  assert.deepEqual(back.steps[1].action, { guess: 'crane' });
  assert.equal(back.steps[2].error.code, 'INVALID_ACTION');
  assert.equal(back.header.format, FORMAT);
  assert.equal(back.header.env.fingerprint, 'sha256:abc');
});

test('a file of many episodes gives them all, in order, with a line each for a picker', () => {
  const text = toJsonl(episode('e1', 1), meta) + toJsonl(episode('e2', 2), meta);
  const all = fromJsonl(text);
  assert.deepEqual(all.map((e) => e.episode), ['e1', 'e2']);
  assert.equal(describe(all[1]), 'e2 · seed 2 · 2 steps · unfinished · return 0.5');
});

test('what is not an episode file is said to be not one', () => {
  assert.throws(() => fromJsonl('{"kind": "step"}\n'), /does not start with a header/);
  assert.throws(() => fromJsonl('{"kind": "header", "format": "corral-episodes/9"}\n'), /newer than this UI reads/);
  assert.throws(() => fromJsonl('nope\n'), /line 1 is not JSON/);
});
