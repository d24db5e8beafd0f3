// The other views: contract, protocol inspector, the snippet dialog, server view.

import { h, $, clear } from './dom.js';
import { json, mask, sessionLabel } from './values.js';
import { fieldTable, sparkline } from './observe.js';

const MAX_FRAMES = 500;

export class Inspector {
  constructor(body, detail) {
    this.body = body;
    this.detail = detail;
    this.frames = [];
  }

  add(dir, message, text) {
    const frame = { dir, message, text, t: new Date() };
    this.frames.push(frame);
    if (this.frames.length > MAX_FRAMES) {
      this.frames.shift();
      this.body.firstElementChild?.remove();
    }
    const m = message || {};
    this.body.append(
      h(
        'tr',
        { class: `frame ${dir} ${m.type === 'error' ? 'error' : ''}`, tabindex: 0, onclick: () => this.show(frame), onkeydown: (e) => e.key === 'Enter' && this.show(frame) },
        h('td', { text: dir === 'out' ? '→' : '←', 'aria-label': dir === 'out' ? 'sent' : 'received' }),
        h('td', { text: m.id ?? '' }),
        h('td', { text: m.type ?? '?' }),
        h('td', { text: m.session ? sessionLabel(m.session) : '' }),
        h('td', { text: String(text.length) }),
        h('td', { text: frame.t.toLocaleTimeString() }),
      ),
    );
  }

  show(frame) {
    this.detail.textContent = frame.message ? json(mask(frame.message)) : frame.text;
  }

  clear() {
    this.frames = [];
    clear(this.body);
    this.detail.textContent = '';
  }
}

export function showContract(el, { schema, identity, welcome }) {
  const limits = welcome?.limits || {};
  clear(
    el,
    fieldTable({
      name: identity.name,
      description: identity.description,
      contract_version: identity.contract_version,
      fingerprint: identity.fingerprint,
      compat: welcome?.compat,
      server: welcome?.server,
      auto_reset: identity.auto_reset,
    }),
    h('h3', { text: 'Server limits' }),
    fieldTable(limits),
    ['action', 'observation', 'state', 'reset_options'].filter((k) => schema[k]).map((k) =>
      h('details', { class: 'schema', open: k === 'action' }, h('summary', { text: `${k} schema` }), h('pre', { class: 'obj', text: json(schema[k]) })),
    ),
    identity.readme_content ? h('details', { class: 'readme' }, h('summary', { text: 'README' }), h('pre', { class: 'long', text: identity.readme_content })) : null,
  );
}

// -- snippet dialog (the snippets are snippets.js's) ----------------------------------

export function showSnippet(title, text) {
  const dialog = $('#snippet-dialog');
  $('#snippet-title').textContent = title;
  $('#snippet').textContent = text;
  $('#snippet-copy').onclick = async () => {
    try {
      await navigator.clipboard.writeText(text);
      $('#snippet-copy').textContent = 'Copied';
    } catch {
      getSelection().selectAllChildren($('#snippet'));
      $('#snippet-copy').textContent = 'Selected: press Ctrl+C';
    }
  };
  $('#snippet-close').onclick = () => dialog.close();
  $('#snippet-copy').textContent = 'Copy';
  dialog.showModal();
}

// -- server view ----------------------------------------------------------------------

const ms = (s) => (s === null || s === undefined ? '—' : `${(s * 1000).toFixed(s < 0.001 ? 2 : 1)} ms`);

export class ServerView {
  constructor(el, fetchStatus) {
    this.el = el;
    this.fetchStatus = fetchStatus;
    this.timer = null;
  }

  start() {
    if (this.timer) return;
    const tick = async () => {
      try {
        this.show(await this.fetchStatus());
      } catch (e) {
        clear(this.el, h('p', { class: 'warn', text: `status unavailable: ${e.code || ''} ${e.message}` }));
      }
      if (this.timer) this.timer = setTimeout(tick, 2000);
    };
    this.timer = setTimeout(tick, 0);
  }

  stop() {
    clearTimeout(this.timer);
    this.timer = null;
  }

  show(s) {
    this.last = s;
    const hist = s.history || [];
    const errorsPer = hist.map((x, i) => (i ? Math.max(0, x.errors - hist[i - 1].errors) : 0));
    const cap = s.capacity;
    const spark = (label, values, text) =>
      h('figure', { class: 'sparkfig' }, sparkline(values, { label }), h('figcaption', {}, label, ' ', h('b', { text })));
    const last = hist[hist.length - 1] || {};
    clear(
      this.el,
      h(
        'div',
        { class: 'row wrap' },
        h('div', { class: 'capacity' }, 'sessions ', h('b', { 'data-stat': 'active', text: `${cap.active} / ${cap.max}` }), h('meter', { min: 0, max: cap.max, value: cap.active, 'aria-label': 'capacity used' })),
        h('span', { class: 'stat' }, 'connections ', h('b', { text: String(s.connections) })),
        h('span', { class: 'stat' }, 'uptime ', h('b', { text: `${Math.round(s.server.uptime_s)} s` })),
        h('span', { class: 'stat' }, 'workers ', h('b', { text: String(s.server.workers) })),
      ),
      h(
        'div',
        { class: 'row wrap' },
        spark('active sessions', hist.map((x) => x.active), String(last.active ?? cap.active)),
        spark('step p50', hist.map((x) => x.p50), ms(last.p50)),
        spark('step p99', hist.map((x) => x.p99), ms(last.p99)),
        spark('errors / sample', errorsPer, String(errorsPer[errorsPer.length - 1] ?? 0)),
      ),
      h('h3', { text: 'Counters' }),
      fieldTable({ ...s.counters, ...Object.fromEntries(Object.entries(s.latency).map(([op, l]) => [`${op} latency`, `p50 ${ms(l.p50_s)} · p99 ${ms(l.p99_s)} · n=${l.count}`])) }, { asText: true }),
      h('h3', { text: 'Errors by code' }),
      Object.keys(s.errors).length ? fieldTable(s.errors) : h('p', { class: 'hint', text: 'none' }),
      h('h3', { text: `Live sessions (${s.sessions_total})` }),
      h(
        'table',
        { class: 'sessions' },
        h('thead', {}, h('tr', {}, ['id', 'age', 'idle', 'episodes', 'steps', 'phase', 'connection', 'worker'].map((c) => h('th', { text: c })))),
        h(
          'tbody',
          {},
          s.sessions.map((x) =>
            h(
              'tr',
              {},
              h('td', {}, h('code', { text: x.id })),
              h('td', { text: `${x.age_s.toFixed(0)} s` }),
              h('td', { text: `${x.idle_s.toFixed(0)} s` }),
              h('td', { text: String(x.episodes) }),
              h('td', { text: String(x.steps) }),
              h('td', { text: x.phase + (x.busy ? ' (busy)' : '') }),
              h('td', { text: x.connection === null ? 'detached' : `#${x.connection} ${x.codec ?? ''}` }),
              h('td', { text: x.worker === null ? '—' : String(x.worker) }),
            ),
          ),
        ),
      ),
    );
  }
}
