// corral/1 over one WebSocket with the JSON codec: hello/welcome, then sessions.
// Every request carries an id; replies are matched by id. The page never builds a frame
// the public protocol does not define.

export class WireError extends Error {
  constructor(reply) {
    super(reply.message || reply.code);
    this.code = reply.code;
    this.details = reply.details || {};
    this.reply = reply;
  }
}

// The server's base URL: the page is at <base>/web/.
export const baseUrl = (href = location.href) => new URL('..', href);

export function wsUrl(path = 'ws', href = location.href) {
  const url = new URL(path, baseUrl(href));
  url.protocol = url.protocol === 'https:' ? 'wss:' : 'ws:';
  return url.href;
}

// Request ids are unique for the page's lifetime, not per connection: a session resumed
// on a new connection remembers its recent ids and answers a repeated one from its cache.
let nextId = 1;

// `socket(url, protocols)` makes the WebSocket (the browser's by default; the unit tests
// give a fake one).
export class Wire {
  constructor({ onFrame = () => {}, onClose = () => {}, socket = (url, protocols) => new WebSocket(url, protocols), url = wsUrl } = {}) {
    this.onFrame = onFrame;
    this.onClose = onClose;
    this.socket = socket;
    this.url = url;
    this.pending = new Map();
    this.welcome = null;
    this.ws = null;
  }

  get open() {
    return this.ws !== null && this.ws.readyState === 1; // WebSocket.OPEN
  }

  connect() {
    return new Promise((resolve, reject) => {
      const ws = this.socket(this.url(), ['corral.v1.json']);
      this.ws = ws;
      ws.onopen = () => {
        this.request({ type: 'hello', protocol: 'corral/1', client: 'corral-web' }).then(
          (welcome) => resolve((this.welcome = welcome)),
          reject,
        );
      };
      ws.onmessage = (event) => this.receive(event.data);
      ws.onerror = () => reject(new Error('the WebSocket could not connect'));
      ws.onclose = (event) => {
        for (const { reject: fail } of this.pending.values()) {
          fail(new WireError({ code: 'CONNECTION_LOST', message: 'the connection closed' }));
        }
        this.pending.clear();
        if (this.ws === ws) this.ws = null;
        this.onClose(event);
      };
    });
  }

  receive(text) {
    let message;
    try {
      message = JSON.parse(text);
    } catch {
      this.onFrame('in', null, text);
      return;
    }
    this.onFrame('in', message, text);
    const waiter = this.pending.get(message.id);
    if (!waiter) return;
    this.pending.delete(message.id);
    if (message.type === 'error') waiter.reject(new WireError(message));
    else waiter.resolve(message);
  }

  // Send `message` under a new request id, or under `id` (the same request sent again).
  request(message, id = nextId++) {
    if (!this.open) {
      return Promise.reject(new WireError({ code: 'CONNECTION_LOST', message: 'not connected' }));
    }
    const frame = { ...message, id };
    const text = JSON.stringify(frame);
    return new Promise((resolve, reject) => {
      this.pending.set(frame.id, { resolve, reject });
      this.onFrame('out', frame, text);
      this.ws.send(text);
    });
  }

  // Closed on purpose: nothing reconnects it (connection.js reads `closing`).
  close() {
    this.closing = true;
    if (this.ws) this.ws.close(1000, 'closed by the page');
  }
}

// One session on a Wire: reset/step/state/close, with the round-trip time of each call.
// `whenBack` (set by connection.js) waits for a dropped connection to come back; a request
// cut by the drop is then sent again under its id, so the server runs it at most once.
export class Session {
  constructor(wire, id, token) {
    this.wire = wire;
    this.id = id;
    this.token = token;
    this.whenBack = null;
  }

  static async open(wire) {
    const reply = await wire.request({ type: 'open' });
    return new Session(wire, reply.session, reply.token);
  }

  async attach(wire) {
    const reply = await wire.request({ type: 'attach', session: this.id, token: this.token });
    this.wire = wire;
    return reply;
  }

  // The reply and its round-trip time; a failure carries its time as error.ms.
  async timed(message) {
    const started = performance.now();
    const id = nextId++;
    for (;;) {
      try {
        const reply = await this.wire.request({ ...message, session: this.id }, id);
        return { reply, ms: performance.now() - started };
      } catch (error) {
        if (error.code === 'CONNECTION_LOST' && this.whenBack) {
          try {
            await this.whenBack();
            continue;
          } catch (gone) {
            gone.ms = performance.now() - started;
            throw gone instanceof WireError ? gone : new WireError({ code: gone.code || 'CONNECTION_LOST', message: gone.message, details: gone.details });
          }
        }
        error.ms = performance.now() - started;
        throw error;
      }
    }
  }

  reset(seed, options) {
    const message = { type: 'reset', options: options || {} };
    if (seed !== null && seed !== undefined) message.seed = seed;
    return this.timed(message);
  }

  step(action) {
    return this.timed({ type: 'step', action });
  }

  async state() {
    return (await this.timed({ type: 'state' })).reply.state;
  }

  // The session's snapshot envelope (opaque here).
  async snapshot() {
    return (await this.timed({ type: 'snapshot' })).reply.snapshot;
  }

  // A new session restored from a snapshot.
  static async restore(wire, snapshot) {
    const reply = await wire.request({ type: 'restore', snapshot });
    return new Session(wire, reply.session, reply.token);
  }

  // A session restored from `snapshot` in place of this one (closed once it exists).
  async replacedBy(snapshot) {
    const restored = await Session.restore(this.wire, snapshot);
    await this.close().catch(() => {});
    return restored;
  }

  close() {
    return this.wire.request({ type: 'close', session: this.id });
  }
}

// HTTP to the same origin, with the server's structured errors as WireError. The body
// (parsed when JSON), or {data, headers} with `withHeaders`.
export async function http(path, { method = 'GET', body, headers = {}, withHeaders = false } = {}) {
  const init = { method, headers: { ...headers }, credentials: 'same-origin' };
  if (body !== undefined) {
    init.body = typeof body === 'string' ? body : JSON.stringify(body);
    init.headers['Content-Type'] ??= 'application/json';
  }
  const response = await fetch(new URL(path, baseUrl()), init);
  const text = await response.text();
  let data;
  try {
    data = text ? JSON.parse(text) : null;
  } catch {
    data = text;
  }
  if (!response.ok) {
    const error = new WireError(
      data && data.code ? data : { code: `HTTP_${response.status}`, message: String(text) },
    );
    error.status = response.status;
    throw error;
  }
  return withHeaders ? { data, headers: response.headers } : data;
}
