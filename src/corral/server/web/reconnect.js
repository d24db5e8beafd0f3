// What the page does when its connection drops, decided in one place: a table of
// (state, event) → next state and effects, fed by connection.js (which only dials,
// attaches, arms timers and reports). Pure: no DOM, no sockets, no timers; time and
// randomness come in as arguments, so every row is tested without a browser.
//
// The backoff is the Python client's (corral.protocol.client.ReconnectPolicy): the wait
// before attempt n is min(max, initial × multiplier^n) less a random fraction up to
// `jitter`, and the page gives up once `giveUpMs` have passed since the drop (the
// server's resume window, after which the session is gone anyway). After that the user
// asks for another try (or the browser says it is back online).
//
//   state      event      → state      effects
//   open       lost       → waiting    wait(backoff 0)
//   waiting    timer      → dialing    dial
//   waiting    retry      → dialing    dial
//   dialing    dialed     → attaching  attach           (a session to resume)
//   dialing    dialed     → open       report connected (no session)
//   dialing    lost       → waiting    wait(backoff n)  (within the budget)
//   dialing    lost       → gave_up    report gave_up   (past it)
//   attaching  attached   → open       report resumed
//   attaching  refused    → open       report expired   (the server no longer holds it)
//   attaching  lost       → waiting    wait(backoff n) / gave_up, as dialing
//   gave_up    retry      → dialing    dial             (a new budget)
//   any other pair: nothing happens (a late event of a socket already given up on).

export const POLICY = Object.freeze({ initialMs: 50, maxMs: 2000, multiplier: 2, jitter: 0.5, giveUpMs: 30000 });

// Milliseconds to wait before attempt `attempt` (0-based); `random` is in [0, 1).
export function backoff(policy, attempt, random) {
  let base = policy.initialMs;
  for (let i = 0; i < attempt && base < policy.maxMs; i++) base = Math.min(policy.maxMs, base * policy.multiplier);
  return base * (1 - policy.jitter * random);
}

// Error codes with which a server refuses to re-attach a session: it is gone for good.
export const GONE = new Set(['SESSION_LOST', 'UNKNOWN_SESSION', 'UNAUTHORIZED']);

// A request's error that means the session is gone (an attach refused, or a step on a
// session the server reaped while the page was connected).
export const sessionGone = (error) => Boolean(error) && GONE.has(error.code);

export const STATES = Object.freeze(['open', 'waiting', 'dialing', 'attaching', 'gave_up']);
export const EVENTS = Object.freeze(['lost', 'timer', 'retry', 'dialed', 'attached', 'refused']);

function retryOrGiveUp(r, now) {
  const elapsed = now - r.since;
  const wait = backoff(r.policy, r.attempt, r.random());
  if (elapsed + wait > r.policy.giveUpMs) {
    return ['gave_up', [{ type: 'report', what: 'gave_up', attempts: r.attempt, elapsedMs: elapsed }]];
  }
  r.attempt += 1;
  return ['waiting', [{ type: 'wait', ms: wait, attempt: r.attempt }]];
}

const TABLE = {
  open: {
    lost: (r, { now }) => {
      r.since = now;
      r.attempt = 0;
      return retryOrGiveUp(r, now);
    },
  },
  waiting: {
    timer: () => ['dialing', [{ type: 'dial' }]],
    retry: () => ['dialing', [{ type: 'cancel' }, { type: 'dial' }]],
  },
  dialing: {
    dialed: (r, { hasSession }) => (hasSession ? ['attaching', [{ type: 'attach' }]] : ['open', [{ type: 'report', what: 'connected' }]]),
    lost: (r, { now }) => retryOrGiveUp(r, now),
  },
  attaching: {
    attached: () => ['open', [{ type: 'report', what: 'resumed' }]],
    refused: (r, { error }) => ['open', [{ type: 'report', what: 'expired', error }]],
    lost: (r, { now }) => retryOrGiveUp(r, now),
  },
  gave_up: {
    retry: (r, { now }) => {
      r.since = now;
      r.attempt = 0;
      return ['dialing', [{ type: 'dial' }]];
    },
  },
};

// The recovery of one page's connection (see the table above).
export class Recovery {
  constructor({ policy = POLICY, random = Math.random } = {}) {
    this.policy = policy;
    this.random = random;
    this.state = 'open';
    this.attempt = 0;
    this.since = 0;
  }

  // Feed `event`; returns the effects to carry out, in order. `context` holds `now` (ms),
  // `hasSession` (for dialed) and `error` (for refused).
  handle(event, context = {}) {
    const row = TABLE[this.state]?.[event];
    if (!row) return [];
    const [next, effects] = row(this, { now: 0, ...context });
    this.state = next;
    return effects;
  }

  // Whether a transition exists for (state, event): the table's rows, for the tests.
  static defined(state, event) {
    return Boolean(TABLE[state]?.[event]);
  }
}
