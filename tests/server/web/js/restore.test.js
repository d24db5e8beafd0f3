// Replaying a recorded episode on a session: verify and restore share it.

import { test } from 'node:test';
import assert from 'node:assert/strict';
import { replayEpisode, restoreEpisode, restoreFromSnapshot, compareStep, replayable, keepSnapshot, snapshotAt, SNAPSHOTS_KEPT } from '../../../../src/corral/server/web/restore.js';

// A session whose env adds the action's `n` to a total; `drift` adds 1 from that step on.
function counter({ drift = Infinity, failAt = -1, goneAt = -1 } = {}) {
  let total = 0;
  let steps = 0;
  const calls = [];
  const error = (code) => Object.assign(new Error(code), { code, details: {} });
  return {
    calls,
    async reset(seed, options) {
      calls.push(['reset', seed, options]);
      total = options.start ?? 0;
      steps = 0;
      return { reply: { observation: { total } }, ms: 1 };
    },
    async step(action) {
      steps += 1;
      calls.push(['step', action]);
      if (steps === goneAt) throw error('SESSION_LOST');
      if (steps === failAt || typeof action.n !== 'number') throw Object.assign(error('INVALID_ACTION'), { ms: 2 });
      total += action.n + (steps >= drift ? 1 : 0);
      return { reply: { observation: { total } }, ms: 1 };
    },
    async state() {
      return { total, step_count: steps };
    },
  };
}

const recorded = (...ns) => ({
  seed: 3,
  options: { start: 10 },
  steps: [
    { kind: 'reset', observation: { total: 10 } },
    ...ns.map((n, i) => {
      const total = 10 + ns.slice(0, i + 1).reduce((a, b) => a + (typeof b === 'number' ? b : 0), 0);
      return typeof n === 'number'
        ? { kind: 'step', action: { n }, observation: { total } }
        : { kind: 'step', action: { n }, observation: null, error: { code: 'INVALID_ACTION', message: 'no' } };
    }),
  ],
});

test('an identical replay reports no difference and sends the recorded requests', async () => {
  const session = counter();
  const seen = [];
  const outcome = await replayEpisode(session, recorded(1, 2, 'x', 3), { onStep: (i, r) => seen.push([i, r.error?.code ?? null, r.state?.step_count ?? null]), withState: true });
  assert.deepEqual(outcome, { diverged: null, replayed: 5 });
  assert.deepEqual(session.calls[0], ['reset', 3, { start: 10 }]);
  assert.deepEqual(seen, [[0, null, 0], [1, null, 1], [2, null, 2], [3, 'INVALID_ACTION', null], [4, null, 4]]);
});

test('the first difference stops the replay and says where', async () => {
  const session = counter({ drift: 2 });
  const outcome = await replayEpisode(session, recorded(1, 2, 3));
  assert.deepEqual(outcome, { diverged: { index: 2, recorded: { total: 13 }, replayed: { total: 14 } }, replayed: 3 });
  assert.equal(session.calls.length, 3); // reset, step 1, step 2: nothing after the difference
});

test('an error code that differs is a difference too', async () => {
  const outcome = await replayEpisode(counter({ failAt: 1 }), recorded(1));
  assert.deepEqual(outcome.diverged, { index: 1, recorded: { total: 11 }, replayed: { code: 'INVALID_ACTION', message: 'INVALID_ACTION' } });
});

test('a session gone during the replay is thrown, not taken for an answer', async () => {
  await assert.rejects(replayEpisode(counter({ goneAt: 2 }), recorded(1, 2, 3)), (e) => e.code === 'SESSION_LOST');
});

test('a last step cut by the session loss is not replayed; a link\'s bare actions match anything', () => {
  const ep = recorded(1, 2);
  ep.steps.push({ kind: 'step', action: { n: 5 }, observation: null, error: { code: 'SESSION_LOST' } });
  assert.equal(replayable(ep).length, 3);
  assert.equal(compareStep(1, { kind: 'step', action: { n: 1 } }, { total: 99 }, null), null);
});

test('restore replays while there is no snapshot to restore from', async () => {
  assert.equal(await restoreFromSnapshot(counter(), recorded(1)), null);
  const outcome = await restoreEpisode(counter(), recorded(1, 2));
  assert.deepEqual(outcome, { how: 'replay', diverged: null, replayed: 3 });
});

// A counter session that can be replaced by one restored from a snapshot ({total}).
function restorable(refuse = null) {
  const session = counter();
  session.closed = false;
  session.close = async () => {
    session.closed = true;
  };
  session.replacedBy = async (snapshot) => {
    if (refuse) throw Object.assign(new Error(refuse), { code: refuse, details: {} });
    const next = counter();
    await next.reset(null, { start: snapshot.total });
    next.restoredFrom = snapshot;
    await session.close();
    return next;
  };
  return session;
}

test('snapshots are kept per step, the latest ones only', () => {
  const ep = recorded(1, 2);
  for (let i = 0; i < SNAPSHOTS_KEPT + 5; i++) keepSnapshot(ep, i, { total: i });
  assert.equal(ep.snapshots.size, SNAPSHOTS_KEPT);
  assert.equal(snapshotAt(ep, 4), null);
  assert.deepEqual(snapshotAt(ep, SNAPSHOTS_KEPT + 4), { total: SNAPSHOTS_KEPT + 4 });
  keepSnapshot(ep, 5, { total: 'again' }); // a step snapshotted again is the newest
  assert.deepEqual(snapshotAt(ep, 5), { total: 'again' });
  assert.equal(snapshotAt(recorded(1), 0), null);
});

test('restore uses the snapshot of the last step and nothing is replayed', async () => {
  const ep = recorded(1, 2);
  keepSnapshot(ep, 1, { total: 11 });
  const fresh = restorable();
  assert.equal(await restoreFromSnapshot(fresh, ep), null); // the last step has none
  keepSnapshot(ep, 2, { total: 13 });
  const outcome = await restoreEpisode(fresh, ep);
  assert.equal(outcome.how, 'snapshot');
  assert.equal(outcome.replayed, 3);
  assert.equal(outcome.steps.length, 3);
  outcome.steps.push({ kind: 'step' });
  assert.equal(ep.steps.length, 3); // the live copy grows, the expired episode does not
  assert.deepEqual(outcome.session.restoredFrom, { total: 13 });
  assert.ok(fresh.closed);
  assert.deepEqual(fresh.calls, []); // no reset, no step on the fresh session
});

test('a snapshot the server refuses falls back to replay; other failures are thrown', async () => {
  const ep = recorded(1, 2);
  keepSnapshot(ep, 2, { total: 13 });
  const outcome = await restoreEpisode(restorable('BAD_SNAPSHOT'), ep);
  assert.deepEqual(outcome, { how: 'replay', diverged: null, replayed: 3 });
  await assert.rejects(restoreEpisode(restorable('CONNECTION_LOST'), ep), (e) => e.code === 'CONNECTION_LOST');
});
