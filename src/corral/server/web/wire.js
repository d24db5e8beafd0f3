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

export function wsUrl(path = 'ws') {
  const url = new URL(path, new URL('..', location.href));
  url.protocol = location.protocol === 'https:' ? 'wss:' : 'ws:';
  return url.href;
}

// Request ids are unique for the page's lifetime, not per connection: a session resumed
// on a new connection remembers its recent ids and answers a repeated one from its cache.
let nextId = 1;

export class Wire {
  constructor({ onFrame = () => {}, onClose = () => {} } = {}) {
    this.onFrame = onFrame;
    this.onClose = onClose;
    this.pending = new Map();
    this.welcome = null;
    this.ws = null;
  }

  get open() {
    return this.ws !== null && this.ws.readyState === WebSocket.OPEN;
  }

  connect() {
    return new Promise((resolve, reject) => {
      const ws = new WebSocket(wsUrl(), ['corral.v1.json']);
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

  request(message) {
    if (!this.open) {
      return Promise.reject(new WireError({ code: 'CONNECTION_LOST', message: 'not connected' }));
    }
    const frame = { ...message, id: nextId++ };
    const text = JSON.stringify(frame);
    return new Promise((resolve, reject) => {
      this.pending.set(frame.id, { resolve, reject });
      this.onFrame('out', frame, text);
      this.ws.send(text);
    });
  }

  close() {
    if (this.ws) this.ws.close(1000, 'closed by the page');
  }
}

// One session on a Wire: reset/step/state/close, with the round-trip time of each call.
export class Session {
  constructor(wire, id, token) {
    this.wire = wire;
    this.id = id;
    this.token = token;
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
    try {
      const reply = await this.wire.request({ ...message, session: this.id });
      return { reply, ms: performance.now() - started };
    } catch (error) {
      error.ms = performance.now() - started;
      throw error;
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

  close() {
    return this.wire.request({ type: 'close', session: this.id });
  }
}

// HTTP to the same origin, with the server's structured errors as WireError.
export async function http(path, { method = 'GET', body, headers = {} } = {}) {
  const init = { method, headers: { ...headers }, credentials: 'same-origin' };
  if (body !== undefined) {
    init.body = typeof body === 'string' ? body : JSON.stringify(body);
    init.headers['Content-Type'] ??= 'application/json';
  }
  const response = await fetch(new URL(path, new URL('..', location.href)), init);
  const text = await response.text();
  let data = null;
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
  return data;
}
