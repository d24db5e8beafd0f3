// Equality, differences (arrays element by element), masking, short text.

import { test } from 'node:test';
import assert from 'node:assert/strict';
import { equal, diff, mask, unmask, short, shown, sessionLabel, MASK } from '../../../../src/corral/server/web/values.js';

const int8 = (values, shape = [values.length]) => ({ dtype: '|i1', shape, data: Buffer.from(Int8Array.from(values).buffer).toString('base64') });

test('equal ignores key order and nothing else', () => {
  assert.ok(equal({ a: 1, b: [1, { c: null }] }, { b: [1, { c: null }], a: 1 }));
  assert.ok(!equal({ a: 1 }, { a: 1, b: undefined }));
  assert.ok(!equal([1, 2], { 0: 1, 1: 2 }));
  assert.ok(!equal({ a: 1 }, { b: 1 }));
  assert.ok(!equal(0, false));
});

test('diff names each changed leaf; list positions are numbers', () => {
  assert.deepEqual(diff({ a: 1, b: [1, 2], c: { d: 'x' } }, { a: 1, b: [1, 3], c: {} }), [
    { path: ['b', 1], before: 2, after: 3 },
    { path: ['c', 'd'], before: 'x', after: undefined },
  ]);
  assert.deepEqual(diff(1, 'a'), [{ path: [], before: 1, after: 'a' }]);
});

test('two boards differ at the squares that changed, not in their base64', () => {
  const before = { board: int8([0, 0, 0, 0, 0, 0, 0, 0, 0], [3, 3]) };
  const after = { board: int8([0, 0, 0, 0, 1, 0, 0, 0, -1], [3, 3]) };
  assert.deepEqual(diff(before, after), [
    { path: ['board', 1, 1], before: 0, after: 1 },
    { path: ['board', 2, 2], before: 0, after: -1 },
  ]);
  // Different shapes: the whole array is one change.
  assert.equal(diff({ b: int8([1]) }, { b: int8([1, 2]) }).length, 1);
});

test('secrets are masked wherever shown, and come back from under the mask', () => {
  const action = { api_key: 'hunter2', nested: [{ password: 'pw', ok: 'x' }], token: '' };
  const masked = mask(action);
  assert.deepEqual(masked, { api_key: MASK, nested: [{ password: MASK, ok: 'x' }], token: '' });
  assert.deepEqual(unmask(masked, action), action);
  assert.deepEqual(unmask({ ...masked, api_key: 'typed' }, action).api_key, 'typed');
});

test('short text cuts with an ellipsis, arrays as numbers', () => {
  assert.equal(short('abcdef', 4), 'abc…');
  assert.equal(short({ board: int8([0, -1, 1]) }, 60), '{"board":[0,-1,1]}');
  assert.equal(short(undefined), '');
  assert.deepEqual(shown({ api_key: 'k', board: int8([1, 2]) }), { api_key: MASK, board: [1, 2] });
});

test('a session is labelled by its random part, not its server', () => {
  assert.equal(sessionLabel('pod-3~0123456789abcdef~feedbeef'), '01234567');
  assert.equal(sessionLabel('0123456789abcdef'), '01234567');
  assert.equal(sessionLabel('a~b'), 'a~b');
});
