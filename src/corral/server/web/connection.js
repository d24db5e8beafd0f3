// The page's connection to the server and the one session it plays on: the I/O face of
// reconnect.js's Recovery. It dials, attaches, arms timers and reports; every decision
// (wait how long, attach or not, give up) is the Recovery table's.
//
// Reports go to the callbacks given to the constructor:
//   onStatus({text, kind, state})  the connection pill (and whether to offer a retry)
//   onResumed(session)             a dropped connection came back with its session
//   onExpired(session, error)      the server no longer holds the session (the page
//                                  keeps its episode; see play.js)
//   onConnected()                  a dropped connection came back (no session to resume)
//   onFrame(dir, message, text)    every frame in and out (the inspector)
//
// A request in flight when the socket drops is not failed: the session waits for the
// connection to come back (whenBack) and sends it again under the same request id, which
// the server answers from its reply cache if it had run it (at most once, as the Python
// client does). It fails only when the session is gone or the page gave up.

import { Wire, Session } from './wire.js';
import { Recovery, POLICY } from './reconnect.js';

export const browserClock = {
  now: () => performance.now(),
  setTimeout: (fn, ms) => setTimeout(fn, ms),
  clearTimeout: (handle) => clearTimeout(handle),
};

function deferred() {
  let resolve;
  let reject;
  const promise = new Promise((yes, no) => {
    resolve = yes;
    reject = no;
  });
  promise.catch(() => {}); // nobody may be waiting for it
  return { promise, resolve, reject };
}

const seconds = (ms) => `${(ms / 1000).toFixed(ms < 1000 ? 2 : 1)} s`;

export class Connection {
  constructor({
    dial = (handlers) => new Wire(handlers),
    openSession = (wire) => Session.open(wire),
    clock = browserClock,
    policy = POLICY,
    random = Math.random,
    onStatus = () => {},
    onFrame = () => {},
    onResumed = () => {},
    onExpired = () => {},
    onConnected = () => {},
  } = {}) {
    this.dial = dial;
    this.openSessionOn = openSession;
    this.clock = clock;
    this.recovery = new Recovery({ policy, random });
    this.callbacks = { onStatus, onFrame, onResumed, onExpired, onConnected };
    this.wire = null;
    this.session = null;
    this.timer = null;
    this.lastClose = null;
    this.back = null;
  }

  // Settles when a dropped connection is back with the session (resolves) or the session
  // is gone or the page gave up (rejects with the reason); at once while connected.
  whenBack() {
    if (this.live) return Promise.resolve();
    if (!this.back) this.back = deferred();
    return this.back.promise;
  }

  settle(error) {
    const back = this.back;
    this.back = null;
    if (!back) return;
    if (error) back.reject(error);
    else back.resolve();
  }

  get live() {
    return Boolean(this.session && this.wire && this.wire.open && this.session.wire === this.wire);
  }

  get welcome() {
    return this.wire?.welcome ?? null;
  }

  status(text, kind = '') {
    this.callbacks.onStatus({ text, kind, state: this.recovery.state });
  }

  // The first connection: its failure is the caller's to show (nothing is retried before
  // the page has worked once).
  async start() {
    this.status('connecting…');
    await this.connectWire();
    // The server's resume window bounds how long a dropped session is worth chasing.
    const window = Number(this.wire.welcome?.limits?.resume_window_s);
    if (Number.isFinite(window) && window > 0) {
      this.recovery.policy = { ...this.recovery.policy, giveUpMs: Math.max(this.recovery.policy.giveUpMs, window * 1000) };
    }
    this.status('connected', 'ok');
    return this.wire;
  }

  // A new wire, the current one from now on (a late close of an older one is ignored).
  async connectWire() {
    const wire = this.dial({
      onFrame: (...args) => this.callbacks.onFrame(...args),
      onClose: (event) => this.closed(wire, event),
    });
    this.wire = wire;
    try {
      await wire.connect();
    } catch (error) {
      // A refused hello leaves the socket open: close it, so that `closed` runs once.
      if (wire.open) wire.close();
      throw error;
    }
    return wire;
  }

  async openSession() {
    if (!this.wire || !this.wire.open) throw Object.assign(new Error('not connected'), { code: 'CONNECTION_LOST' });
    const session = await this.openSessionOn(this.wire);
    session.whenBack = () => this.whenBack();
    this.session = session;
    return session;
  }

  // Play on `session` from now on (restored, or a branch); the previous one is closed.
  async adopt(session) {
    const previous = this.session;
    session.whenBack = () => this.whenBack();
    this.session = session;
    if (previous && previous !== session) await previous.close().catch(() => {});
  }

  async closeSession() {
    const session = this.session;
    this.session = null;
    if (session) await session.close().catch(() => {});
  }

  // Ask for another attempt now (the user's button, or the browser back online).
  retry() {
    this.run(this.recovery.handle('retry', { now: this.clock.now() }));
  }

  feed(event, context = {}) {
    this.run(this.recovery.handle(event, { now: this.clock.now(), hasSession: Boolean(this.session), ...context }));
  }

  closed(wire, event) {
    if (wire !== this.wire || wire.closing) return;
    this.lastClose = event.code ?? null;
    if (!this.back) this.back = deferred();
    this.feed('lost');
  }

  run(effects) {
    for (const effect of effects) {
      switch (effect.type) {
        case 'wait':
          this.status(`disconnected (${this.lastClose ?? 'no answer'}): reconnecting in ${seconds(effect.ms)} (attempt ${effect.attempt})…`, 'bad');
          this.timer = this.clock.setTimeout(() => {
            this.timer = null;
            this.feed('timer');
          }, effect.ms);
          break;
        case 'cancel':
          if (this.timer !== null) this.clock.clearTimeout(this.timer);
          this.timer = null;
          break;
        case 'dial':
          this.status('reconnecting…', 'bad');
          this.redial();
          break;
        case 'attach':
          this.reattach();
          break;
        case 'report':
          this.report(effect);
          break;
        default:
          throw new Error(`unknown effect ${effect.type}`);
      }
    }
  }

  async redial() {
    try {
      await this.connectWire();
    } catch {
      // The socket's own close, if it comes, finds the state moved on and is ignored.
      this.lastClose = null;
      this.feed('lost');
      return;
    }
    this.feed('dialed');
  }

  async reattach() {
    const session = this.session;
    try {
      await session.attach(this.wire);
    } catch (error) {
      if (error.code === 'CONNECTION_LOST') return; // the socket's close feeds `lost`
      this.feed('refused', { error });
      return;
    }
    this.feed('attached');
  }

  report(effect) {
    switch (effect.what) {
      case 'connected':
        this.status('connected', 'ok');
        this.settle(null);
        this.callbacks.onConnected();
        break;
      case 'resumed':
        this.status('resumed', 'ok');
        this.settle(null);
        this.callbacks.onResumed(this.session);
        break;
      case 'expired': {
        const session = this.session;
        this.session = null;
        this.status('connected (the session had expired)', 'warn');
        this.settle(effect.error);
        this.callbacks.onExpired(session, effect.error);
        break;
      }
      case 'gave_up': {
        const text = `disconnected: gave up after ${seconds(effect.elapsedMs)} (${effect.attempts} attempts)`;
        this.status(text, 'bad');
        this.settle(Object.assign(new Error(text), { code: 'CONNECTION_LOST', details: {} }));
        break;
      }
      default:
        throw new Error(`unknown report ${effect.what}`);
    }
  }

  // The page goes away: close without reconnecting.
  shutdown() {
    if (this.timer !== null) this.clock.clearTimeout(this.timer);
    this.timer = null;
    if (this.wire) this.wire.close();
  }
}
