// The reconnect table, row by row, and the backoff against the Python client's.

import { test } from 'node:test';
import assert from 'node:assert/strict';
import { Recovery, POLICY, STATES, EVENTS, backoff, sessionGone } from '../../../../src/corral/server/web/reconnect.js';

const at = (state, fields = {}) => Object.assign(new Recovery({ random: () => 0 }), { state }, fields);

test('the backoff is the Python ReconnectPolicy: doubling from 50 ms to 2 s, jitter off the top', () => {
  // corral.protocol.client.ReconnectPolicy().delay(n, rng) with rng.random() == 0 and 1.
  const expected = [50, 100, 200, 400, 800, 1600, 2000, 2000, 2000];
  assert.deepEqual(expected.map((_, n) => backoff(POLICY, n, 0)), expected);
  assert.deepEqual(expected.map((_, n) => backoff(POLICY, n, 0.999999)).map(Math.round), expected.map((ms) => Math.round(ms * 0.5)));
  assert.equal(backoff(POLICY, 10_000, 0), 2000); // no overflow after many attempts
});

test('open --lost--> waiting: the first wait is the first backoff', () => {
  const r = at('open');
  assert.deepEqual(r.handle('lost', { now: 1000 }), [{ type: 'wait', ms: 50, attempt: 1 }]);
  assert.equal(r.state, 'waiting');
  assert.equal(r.since, 1000);
});

test('waiting --timer--> dialing; waiting --retry--> dialing without the wait', () => {
  const r = at('waiting');
  assert.deepEqual(r.handle('timer'), [{ type: 'dial' }]);
  assert.equal(r.state, 'dialing');
  const s = at('waiting');
  assert.deepEqual(s.handle('retry'), [{ type: 'cancel' }, { type: 'dial' }]);
  assert.equal(s.state, 'dialing');
});

test('dialing --dialed--> attaching with a session, open without one', () => {
  const r = at('dialing');
  assert.deepEqual(r.handle('dialed', { hasSession: true }), [{ type: 'attach' }]);
  assert.equal(r.state, 'attaching');
  const s = at('dialing');
  assert.deepEqual(s.handle('dialed', { hasSession: false }), [{ type: 'report', what: 'connected' }]);
  assert.equal(s.state, 'open');
});

test('dialing --lost--> waiting, each wait longer, until the budget is spent: gave_up', () => {
  const r = at('open');
  r.handle('lost', { now: 0 });
  const waits = [];
  let now = 0;
  for (;;) {
    const [effect] = r.handle('timer', { now });
    assert.equal(effect.type, 'dial');
    const [next] = r.handle('lost', { now });
    if (next.type === 'report') {
      assert.equal(next.what, 'gave_up');
      assert.equal(r.state, 'gave_up');
      assert.ok(now + backoff(POLICY, r.attempt, 0) > POLICY.giveUpMs);
      break;
    }
    assert.equal(r.state, 'waiting');
    waits.push(next.ms);
    now += next.ms;
  }
  assert.deepEqual(waits.slice(0, 6), [100, 200, 400, 800, 1600, 2000]);
  assert.ok(now <= POLICY.giveUpMs && now > POLICY.giveUpMs - 2000, String(now));
});

test('attaching: attached → resumed; refused → expired with the error; lost → waiting', () => {
  const r = at('attaching', { since: 0 });
  assert.deepEqual(r.handle('attached'), [{ type: 'report', what: 'resumed' }]);
  assert.equal(r.state, 'open');
  const error = { code: 'SESSION_LOST', message: 'gone' };
  const s = at('attaching', { since: 0 });
  assert.deepEqual(s.handle('refused', { error }), [{ type: 'report', what: 'expired', error }]);
  assert.equal(s.state, 'open');
  const t = at('attaching', { since: 0 });
  assert.equal(t.handle('lost', { now: 10 })[0].type, 'wait');
  assert.equal(t.state, 'waiting');
});

test('gave_up --retry--> dialing with a fresh budget', () => {
  const r = at('gave_up', { since: 0, attempt: 9 });
  assert.deepEqual(r.handle('retry', { now: 99_000 }), [{ type: 'dial' }]);
  assert.equal(r.state, 'dialing');
  assert.equal(r.attempt, 0);
  assert.equal(r.since, 99_000);
});

test('every pair without a row does nothing and keeps the state', () => {
  let rows = 0;
  for (const state of STATES) {
    for (const event of EVENTS) {
      if (Recovery.defined(state, event)) {
        rows += 1;
        continue;
      }
      const r = at(state);
      assert.deepEqual(r.handle(event, { now: 5 }), [], `${state} ${event}`);
      assert.equal(r.state, state);
    }
  }
  assert.equal(rows, 9); // the (state, event) pairs of the table in reconnect.js's comment
});

test('which errors mean the session is gone', () => {
  for (const code of ['SESSION_LOST', 'UNKNOWN_SESSION', 'UNAUTHORIZED']) assert.ok(sessionGone({ code }), code);
  for (const code of ['CONNECTION_LOST', 'INVALID_ACTION', 'CAPACITY_REACHED']) assert.ok(!sessionGone({ code }), code);
  assert.ok(!sessionGone(null));
});
