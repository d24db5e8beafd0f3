// Shared by the UI's node tests: where the modules are, and fakes for what a browser has.

export const WEB = new URL('../../../../src/corral/server/web/', import.meta.url);

// A clock whose timers run when the test says (advance), never by themselves.
export class FakeClock {
  constructor() {
    this.t = 0;
    this.timers = new Map();
    this.next = 1;
  }

  now = () => this.t;

  setTimeout = (fn, ms) => {
    const id = this.next++;
    this.timers.set(id, { at: this.t + ms, fn });
    return id;
  };

  clearTimeout = (id) => {
    this.timers.delete(id);
  };

  // Move time on by `ms`, running the timers due, in order.
  advance(ms) {
    const until = this.t + ms;
    for (;;) {
      const due = [...this.timers.entries()].filter(([, t]) => t.at <= until).sort((a, b) => a[1].at - b[1].at);
      if (!due.length) break;
      const [id, timer] = due[0];
      this.timers.delete(id);
      this.t = timer.at;
      timer.fn();
    }
    this.t = until;
  }

  get pending() {
    return [...this.timers.values()].map((t) => t.at - this.t);
  }
}

// A WebSocket that the test drives: it records what the page sends; the test opens it,
// answers, or closes it.
export class FakeSocket {
  static made = [];

  constructor(url, protocols) {
    this.url = url;
    this.protocols = protocols;
    this.readyState = 0;
    this.sent = [];
    FakeSocket.made.push(this);
  }

  send(text) {
    this.sent.push(JSON.parse(text));
  }

  close(code = 1000) {
    if (this.readyState === 3) return;
    this.readyState = 3;
    queueMicrotask(() => this.onclose?.({ code }));
  }

  // -- the test's side --

  accept() {
    this.readyState = 1;
    this.onopen?.();
  }

  refuse() {
    this.readyState = 3;
    this.onerror?.();
    queueMicrotask(() => this.onclose?.({ code: 1006 }));
  }

  drop(code = 1006) {
    this.readyState = 3;
    this.onclose?.({ code });
  }

  reply(message) {
    this.onmessage?.({ data: JSON.stringify(message) });
  }

  // The last message of `type` the page sent.
  last(type) {
    return this.sent.filter((m) => m.type === type).at(-1);
  }
}

// Let promise callbacks (and queued microtasks) run.
export const settle = async (rounds = 20) => {
  for (let i = 0; i < rounds; i++) await new Promise((resolve) => setImmediate(resolve));
};
