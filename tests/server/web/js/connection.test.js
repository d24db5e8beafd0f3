// The connection's I/O face against a fake socket and clock: a drop is reconnected with
// backoff and the session re-attached; a request cut by the drop is sent again under its
// id; a session the server no longer holds is reported expired; the page gives up after
// the budget and tries again when asked.

import { test } from 'node:test';
import assert from 'node:assert/strict';
import { Connection } from '../../../../src/corral/server/web/connection.js';
import { Wire } from '../../../../src/corral/server/web/wire.js';
import { POLICY } from '../../../../src/corral/server/web/reconnect.js';
import { FakeClock, FakeSocket, settle } from './support.js';

globalThis.performance ??= { now: () => 0 };

function setup({ window } = {}) {
  FakeSocket.made = [];
  const clock = new FakeClock();
  const events = [];
  const statuses = [];
  const conn = new Connection({
    dial: (handlers) => new Wire({ ...handlers, socket: (url, protocols) => new FakeSocket(url, protocols), url: () => 'ws://127.0.0.1:1/ws' }),
    clock,
    random: () => 0,
    onStatus: (s) => statuses.push(s),
    onResumed: (session) => events.push(['resumed', session.id]),
    onExpired: (session, error) => events.push(['expired', session.id, error.code]),
    onConnected: () => events.push(['connected']),
  });
  const socket = () => FakeSocket.made.at(-1);
  // Open the socket the page just made and answer its hello.
  const handshake = async () => {
    const ws = socket();
    ws.accept();
    const hello = ws.last('hello');
    assert.equal(hello.protocol, 'corral/1');
    ws.reply({ type: 'welcome', id: hello.id, env: { name: 'x' }, limits: window ? { resume_window_s: window } : {}, server: {}, compat: 'exact', protocol: 'corral/1' });
    await settle();
  };
  const connected = async () => {
    const started = conn.start();
    await settle();
    await handshake();
    await started;
    const opening = conn.openSession();
    await settle();
    const open = socket().last('open');
    socket().reply({ type: 'opened', id: open.id, session: 's1', token: 't1' });
    return opening;
  };
  return { conn, clock, events, statuses, socket, handshake, connected };
}

test('a drop is reconnected after the backoff and the session re-attached', async () => {
  const { conn, clock, events, statuses, socket, handshake, connected } = setup();
  await connected();
  assert.ok(conn.live);
  const first = socket();
  first.drop(1006);
  await settle();
  assert.equal(conn.recovery.state, 'waiting');
  assert.deepEqual(clock.pending, [50]);
  assert.match(statuses.at(-1).text, /disconnected \(1006\): reconnecting in 0\.05 s \(attempt 1\)/);
  assert.ok(!conn.live);
  clock.advance(50);
  await settle();
  assert.notEqual(socket(), first);
  await handshake();
  const attach = socket().last('attach');
  assert.deepEqual({ session: attach.session, token: attach.token }, { session: 's1', token: 't1' });
  socket().reply({ type: 'attached', id: attach.id, session: 's1', token: 't1' });
  await settle();
  assert.deepEqual(events, [['resumed', 's1']]);
  assert.equal(statuses.at(-1).text, 'resumed');
  assert.ok(conn.live);
});

test('a step cut by the drop is sent again under its id once the session is back', async () => {
  const { conn, clock, socket, handshake, connected } = setup();
  const session = await connected();
  const stepping = session.step({ guess: 'crane' });
  await settle();
  const sent = socket().last('step');
  socket().drop(1006);
  await settle();
  clock.advance(50);
  await settle();
  await handshake();
  socket().reply({ type: 'attached', id: socket().last('attach').id, session: 's1', token: 't1' });
  await settle();
  const again = socket().last('step');
  assert.deepEqual(again, sent); // same id, same payload: the server runs it at most once
  socket().reply({ type: 'result', id: again.id, session: 's1', observation: { guess: 'crane' } });
  const { reply } = await stepping;
  assert.deepEqual(reply.observation, { guess: 'crane' });
  assert.ok(conn.live);
});

test('an attach refused means the session expired: reported once, the cut request fails with it', async () => {
  const { conn, clock, events, statuses, socket, handshake, connected } = setup();
  const session = await connected();
  const stepping = session.step({ guess: 'crane' }).then(() => null, (e) => e);
  await settle();
  socket().drop(1006);
  await settle();
  clock.advance(50);
  await settle();
  await handshake();
  const attach = socket().last('attach');
  socket().reply({ type: 'error', id: attach.id, code: 'SESSION_LOST', message: 'session s1 is gone: connection lost and not resumed in time' });
  await settle();
  assert.deepEqual(events, [['expired', 's1', 'SESSION_LOST']]);
  assert.equal(conn.session, null);
  assert.match(statuses.at(-1).text, /expired/);
  assert.equal((await stepping)?.code, 'SESSION_LOST');
  assert.equal(socket().sent.filter((m) => m.type === 'step').length, 0); // not re-sent
  assert.equal(conn.recovery.state, 'open'); // connected, ready for a new session
});

test('dial failures back off, double, and give up after the budget; retry starts over', async () => {
  const { conn, clock, statuses, socket, handshake, connected } = setup();
  await connected();
  socket().drop(1006);
  await settle();
  const waits = [];
  while (conn.recovery.state === 'waiting') {
    waits.push(clock.pending[0]);
    clock.advance(clock.pending[0]);
    await settle();
    socket().refuse();
    await settle();
  }
  assert.equal(conn.recovery.state, 'gave_up');
  assert.deepEqual(waits.slice(0, 7), [50, 100, 200, 400, 800, 1600, 2000]);
  assert.ok(clock.t <= POLICY.giveUpMs, String(clock.t));
  assert.match(statuses.at(-1).text, /^disconnected: gave up after \d+\.\d s \(\d+ attempts\)$/);
  assert.equal(statuses.at(-1).state, 'gave_up');
  assert.deepEqual(clock.pending, []); // nothing runs by itself any more
  conn.retry();
  await settle();
  await handshake();
  socket().reply({ type: 'attached', id: socket().last('attach').id, session: 's1', token: 't1' });
  await settle();
  assert.ok(conn.live);
});

test('the budget is at least the server\'s resume window', async () => {
  const { conn, connected } = setup({ window: 120 });
  await connected();
  assert.equal(conn.recovery.policy.giveUpMs, 120_000);
});

test('closing on purpose reconnects nothing', async () => {
  const { conn, clock, socket, connected } = setup();
  await connected();
  const made = FakeSocket.made.length;
  conn.shutdown();
  await settle();
  assert.deepEqual(clock.pending, []);
  assert.equal(FakeSocket.made.length, made);
  assert.equal(socket().readyState, 3);
});
