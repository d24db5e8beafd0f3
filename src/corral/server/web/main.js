// The web UI's entry point: builds the parts, hands each what it needs, wires the page's
// controls to them. The only module with effects at import time.
//
//   connection.js  the socket and the session (reconnect: reconnect.js's table)
//   play.js        resets, steps, the episodes (book.js), verify / restore / import /
//                  export / link; drawn by playview.js, observe.js, forms.js
//   tools.js, panels.js (inspector, contract, server view), auth.js (token dialog)
//
// Each part holds its own state; none reads another's except through what it was given.
// window.corral is a read-only window onto them for the curious and the browser tests;
// no module reads it.

import { h, $, clear } from './dom.js';
import { http } from './wire.js';
import { Connection } from './connection.js';
import { FormWithJson, InputError } from './forms.js';
import { json, sessionLabel } from './values.js';
import { Inspector, showContract, ServerView, showSnippet } from './panels.js';
import { pythonSnippet, curlSnippet } from './snippets.js';
import { Play } from './play.js';
import { Tools } from './tools.js';
import { authed } from './auth.js';

const call = (path, init) => authed(() => http(path, init));

function status({ text, kind, state }) {
  const pill = $('#conn');
  pill.textContent = text;
  pill.className = `pill ${kind}`;
  pill.dataset.state = state;
  // Waiting or given up: the user may ask for a try now.
  $('#reconnect').hidden = state !== 'waiting' && state !== 'gave_up';
}

function showError(error, form) {
  const box = $('#error');
  if (!error) {
    clear(box);
    return;
  }
  const code = error.code || (error instanceof InputError ? 'INPUT' : 'ERROR');
  const details = error.details || {};
  const errors = Array.isArray(details.errors) ? [...details.errors] : [];
  if (error instanceof InputError) errors.push({ loc: error.path, msg: error.message });
  const marked = form ? form.form.highlight(errors) : [];
  clear(
    box,
    h(
      'section',
      { class: 'card error-card', role: 'alert', 'data-code': code },
      h('h2', {}, h('span', { class: 'code', text: code }), ' ', error.message || ''),
      errors.length
        ? h('ul', {}, errors.map((e) => h('li', {}, h('code', { text: (e.loc || []).join('.') || '(action)' }), ' ', e.msg || '')))
        : null,
      Object.keys(details).length && !errors.length ? h('pre', { class: 'obj', text: json(details) }) : null,
      marked.length ? h('p', { class: 'hint', text: `highlighted: ${marked.map((p) => p.join('.')).join(', ')}` }) : null,
    ),
  );
}

// The environment's own view (render hooks): a sandboxed frame without scripts and its
// suggested actions. Requests overtaken by a newer one are dropped.
function viewRenderer(hooks) {
  let ticket = 0;
  return async (obs, latest, onAction) => {
    const frame = $('#env-view');
    const quick = $('#quick-actions');
    const mine = ++ticket;
    if (!obs || !(hooks.render_html || hooks.web_actions)) {
      frame.hidden = true;
      clear(quick);
      return;
    }
    try {
      const view = await http('render', { method: 'POST', body: { observation: obs } });
      if (mine !== ticket) return;
      frame.hidden = view.html === null;
      if (view.html !== null) frame.srcdoc = view.html;
      clear(quick, latest ? view.actions.map((a) => h('button', { type: 'button', class: 'quick', onclick: () => onAction(a.action), text: a.label })) : null);
    } catch (e) {
      frame.hidden = true;
      clear(quick, h('p', { class: 'warn', text: `view unavailable: ${e.code} ${e.message}` }));
    }
  };
}

function showView(name, server) {
  for (const tab of document.querySelectorAll('[role=tab]')) tab.setAttribute('aria-selected', String(tab.dataset.view === name));
  for (const view of document.querySelectorAll('.view')) view.hidden = view.id !== `view-${name}`;
  if (name === 'server') server.start();
  else server.stop();
}

function keys(play, tools) {
  return (e) => {
    const target = e.target;
    const typing = target.closest('input, textarea, select, [contenteditable]');
    if ($('#view-play').hidden) return;
    if (e.key === 'Enter' && !e.shiftKey && !e.ctrlKey && !e.altKey && !e.metaKey) {
      if (target.tagName === 'TEXTAREA' || target.closest('button, summary, dialog, a, label.button')) return;
      const zone = target.closest('[data-enter]')?.dataset.enter ?? 'step';
      e.preventDefault();
      if (zone === 'reset') play.reset();
      else if (zone === 'tool') tools.call();
      else play.step();
    } else if (e.key === 'r' && !typing && !e.ctrlKey && !e.metaKey && !e.altKey) {
      e.preventDefault();
      play.reset();
    }
  };
}

function theme() {
  const root = document.documentElement;
  const dark = root.dataset.theme ? root.dataset.theme === 'dark' : matchMedia('(prefers-color-scheme: dark)').matches;
  root.dataset.theme = dark ? 'light' : 'dark';
  localStorage.setItem('corral-theme', root.dataset.theme);
}

async function start() {
  const saved = localStorage.getItem('corral-theme');
  if (saved) document.documentElement.dataset.theme = saved;
  const inspector = new Inspector($('#frames'), $('#frame'));
  const server = new ServerView($('#server'), () => call('status'));
  let metadata = {};
  const identity = () => ({ ...metadata, ...(conn.welcome?.env || {}) });
  // Defined before the connection so that its callbacks can name it; used after.
  let play = null;
  const conn = new Connection({
    onStatus: status,
    onFrame: (dir, message, text) => inspector.add(dir, message, text),
    onResumed: () => play?.resumed(),
    onExpired: (session, error) => play?.expired(session, error),
    onConnected: () => play?.setBusy(false),
  });
  const tools = new Tools({ http: call });
  const hooks = { render_html: false, web_actions: false };
  play = new Play({ conn, http: call, identity, renderView: viewRenderer(hooks), showError });
  window.corral = Object.freeze({
    get episode() { return play.book.shown; },
    get book() { return play.book; },
    get session() { return conn.session; },
    get wire() { return conn.wire; },
    get conn() { return conn; },
    get actionForm() { return play.actionForm; },
    get schema() { return play.schema; },
    get server() { return server; },
  });

  for (const tab of document.querySelectorAll('[role=tab]')) tab.onclick = () => showView(tab.dataset.view, server);
  $('#theme').onclick = theme;
  $('#reset').onclick = () => play.reset();
  $('#step').onclick = () => play.step();
  $('#close').onclick = async () => {
    await conn.closeSession();
    $('#session-info').textContent = 'session closed';
    $('#open').hidden = false;
    play.setBusy(false);
  };
  $('#open').onclick = async () => {
    try {
      await conn.openSession();
      $('#open').hidden = true;
      $('#session-info').textContent = `session ${sessionLabel(conn.session.id)}…`;
      play.setBusy(false);
      await play.reset();
    } catch (e) {
      showError(e);
    }
  };
  $('#reconnect').onclick = () => conn.retry();
  addEventListener('online', () => conn.retry());
  $('#new-episode').onclick = () => {
    play.randomSeed();
    play.reset();
  };
  $('#verify').onclick = () => play.verify();
  $('#export').onclick = () => play.exportJsonl();
  $('#export-pytest').onclick = () => play.exportPytest();
  $('#share').onclick = () => {
    play.updateLink();
    showSnippet('Link to this episode', location.href);
  };
  $('#import').onchange = (e) => e.target.files[0] && play.importFile(e.target.files[0]);
  $('#copy-python').onclick = () => play.book.shown && showSnippet('Python (AsyncEnvClient)', pythonSnippet(play.book.shown, play.book.selected, play.meta()));
  $('#copy-curl').onclick = () => play.book.shown && showSnippet('curl (HTTP routes)', curlSnippet(play.book.shown, play.book.selected, play.meta()));
  $('#clear-frames').onclick = () => inspector.clear();
  document.addEventListener('keydown', keys(play, tools));
  addEventListener('pagehide', () => {
    tools.close();
    conn.shutdown();
  });
  play.setBusy(false);
  try {
    metadata = await call('metadata');
    const [schema, found] = await Promise.all([http('schema'), http('render').catch(() => hooks)]);
    Object.assign(hooks, found);
    play.schema = schema;
    $('#env-name').textContent = metadata.name;
    document.title = `${metadata.name} · corral`;
    play.actionForm = new FormWithJson(schema.action, { id: 'action', label: 'action' });
    clear($('#action'), play.actionForm.el);
    const optionsSchema = schema.reset_options || { type: 'object', title: 'options', additionalProperties: true };
    play.optionsForm = new FormWithJson(optionsSchema, { id: 'options', label: 'reset options' });
    clear($('#options'), play.optionsForm.el);
    await conn.start();
    await conn.openSession();
    $('#session-info').textContent = `session ${sessionLabel(conn.session.id)}…`;
    $('#env-version').textContent = `contract ${identity().contract_version}`;
    showContract($('#contract'), { schema, identity: identity(), welcome: conn.welcome });
    tools.load();
    play.offerLink(location.hash);
    play.randomSeed(); // a seeded episode can be shared, exported and verified
    await play.reset();
  } catch (e) {
    status({ text: `error: ${e.code || ''} ${e.message}`, kind: 'bad', state: 'error' });
    showError(e);
  }
}

start();
