// The web UI: one corral/1 session per tab, forms from /schema, timeline, replay.

import { h, $, clear, json, short, download, equal, diff, mask } from './dom.js';
import { Wire, Session, WireError, http } from './wire.js';
import { FormWithJson, InputError } from './forms.js';
import { FLAGS, fieldTable, flagsOf, diffView, valueView } from './observe.js';
import { toJsonl, fromJsonl } from './episode.js';
import { Inspector, showContract, ServerView, pythonSnippet, curlSnippet, showSnippet } from './panels.js';

const app = {
  wire: null,
  session: null,
  schema: null,
  metadata: null,
  hooks: { render_html: false, web_actions: false },
  episode: null,
  selected: -1,
  busy: false,
  actionForm: null,
  optionsForm: null,
  tools: [],
  toolForm: null,
  toolSession: null,
  inspector: null,
  server: null,
  diverged: null,
};
window.corral = app; // for the curious (and the browser tests): the live state of this tab

// -- small helpers -------------------------------------------------------------------

function status(text, kind = '') {
  const pill = $('#conn');
  pill.textContent = text;
  pill.className = `pill ${kind}`;
}

function note(text, kind = '') {
  clear($('#episode-note'), text ? h('p', { class: kind, text }) : null);
}

function showError(error, form) {
  const box = $('#error');
  if (!error) {
    clear(box);
    return;
  }
  const code = error.code || (error instanceof InputError ? 'INPUT' : 'ERROR');
  const details = error.details || {};
  const errors = Array.isArray(details.errors) ? details.errors : [];
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

function setBusy(busy) {
  app.busy = busy;
  const live = Boolean(app.session && app.session.wire.open);
  for (const id of ['#new-episode', '#reset', '#verify', '#close']) $(id).disabled = busy || !live;
  $('#step').disabled = busy || !live || !app.episode || app.episode.imported;
}

// -- auth ----------------------------------------------------------------------------

async function authed(fn) {
  try {
    return await fn();
  } catch (e) {
    if (e.status !== 401) throw e;
    await askToken();
    return fn();
  }
}

function askToken() {
  const dialog = $('#token-dialog');
  return new Promise((resolve) => {
    const submit = async () => {
      const token = $('#token').value.trim();
      try {
        const response = await fetch(new URL('../auth', location.href), {
          method: 'POST',
          headers: { Authorization: `Bearer ${token}` },
          credentials: 'same-origin',
        });
        if (!response.ok) throw new Error((await response.json()).message || response.statusText);
        $('#token').value = '';
        dialog.close();
        $('#token-submit').removeEventListener('click', submit);
        resolve();
      } catch (e) {
        $('#token-error').textContent = e.message;
      }
    };
    $('#token-submit').addEventListener('click', submit);
    $('#token').onkeydown = (e) => e.key === 'Enter' && submit();
    dialog.showModal();
  });
}

// -- connection and session ----------------------------------------------------------

async function connect() {
  status('connecting…');
  const wire = new Wire({
    onFrame: (dir, message, text) => app.inspector.add(dir, message, text),
    onClose: (event) => {
      if (app.wire !== wire) return;
      status(`disconnected (${event.code})`, 'bad');
      setBusy(false);
      $('#open').hidden = false;
      $('#open').textContent = app.session ? 'Reconnect' : 'Open session';
    },
  });
  await wire.connect();
  app.wire = wire;
  status('connected', 'ok');
  return wire;
}

async function openSession() {
  const wire = app.wire && app.wire.open ? app.wire : await connect();
  if (app.session && app.session.wire !== wire) {
    try {
      await app.session.attach(wire);
      status('resumed', 'ok');
      $('#open').hidden = true;
      setBusy(false);
      return true;
    } catch (e) {
      note(`could not resume the session (${e.code}): a new one is opened`, 'warn');
    }
  }
  app.session = await Session.open(wire);
  $('#session-info').textContent = `session ${app.session.id.slice(0, 8)}…`;
  $('#open').hidden = true;
  setBusy(false);
  return false;
}

async function closeSession() {
  if (!app.session) return;
  await app.session.close().catch(() => {});
  app.session = null;
  $('#session-info').textContent = 'session closed';
  $('#open').hidden = false;
  $('#open').textContent = 'Open session';
  setBusy(false);
}

// -- episode -------------------------------------------------------------------------

function randomSeed() {
  $('#seed').value = String(Math.floor(Math.random() * 2 ** 31));
}

function seedValue() {
  const raw = $('#seed').value.trim();
  return raw === '' ? null : Number(raw);
}

function optionsValue() {
  return app.optionsForm ? app.optionsForm.value || {} : {};
}

function record(kind, action, reply, ms, error) {
  const obs = reply ? reply.observation : null;
  const error_ = error ? { code: error.code, message: error.message, details: error.details } : null;
  // t: when the request was sent (the episode format's meaning), in ms.
  return { kind, action, observation: obs, ...flagsOf(obs), ms, error: error_, state: null, t: Date.now() - (ms ?? 0) };
}

async function doReset(seed = seedValue(), options = null) {
  if (app.busy || !app.session) return;
  let opts;
  try {
    opts = options ?? optionsValue();
  } catch (e) {
    showError(e, app.optionsForm);
    return;
  }
  setBusy(true);
  showError(null);
  try {
    const { reply, ms } = await app.session.reset(seed, opts);
    const first = record('reset', null, reply, ms, null);
    first.state = await app.session.state().catch(() => null);
    app.episode = { seed, options: opts, steps: [first], imported: false, episode: first.state?.episode_id ?? null };
    app.selected = 0;
    app.diverged = null;
    note('');
    clear($('#import-note'));
    render();
    updateLink();
  } catch (e) {
    showError(e, app.optionsForm);
  } finally {
    setBusy(false);
  }
}

async function doStep(given) {
  if (app.busy || !app.session || !app.episode || app.episode.imported) return;
  let action;
  try {
    action = given ?? app.actionForm.value;
  } catch (e) {
    showError(e, app.actionForm);
    return;
  }
  setBusy(true);
  showError(null);
  app.actionForm.form.clearErrors();
  let entry;
  try {
    const { reply, ms } = await app.session.step(action);
    entry = record('step', action, reply, ms, null);
    entry.state = await app.session.state().catch(() => null);
  } catch (e) {
    if (!(e instanceof WireError)) throw e;
    entry = record('step', action, null, e.ms ?? null, e);
    showError(e, app.actionForm);
  } finally {
    setBusy(false);
  }
  app.episode.steps.push(entry);
  app.selected = app.episode.steps.length - 1;
  render();
  updateLink();
}

function episodeReturn(upTo) {
  let total = 0;
  for (const s of app.episode.steps.slice(1, upTo + 1)) total += s.error ? 0 : Number(s.reward || 0);
  return total;
}

// -- rendering -----------------------------------------------------------------------

function lastGood(index) {
  for (let i = index; i >= 0; i--) if (!app.episode.steps[i].error) return app.episode.steps[i];
  return null;
}

function render() {
  const ep = app.episode;
  renderTimeline();
  if (!ep) return;
  const index = app.selected;
  const step = ep.steps[index];
  const shown = step.error ? lastGood(index) : step;
  const obs = shown ? shown.observation : null;
  $('#obs-step').textContent = index === 0 ? 'after reset' : `after step ${index}${step.error ? ' (failed)' : ''}`;
  const flags = flagsOf(obs);
  clear(
    $('#summary'),
    h('span', { class: 'stat', 'data-stat': 'reward' }, 'reward ', h('b', { text: flags.reward === null ? '—' : String(+flags.reward.toFixed(6)) })),
    h('span', { class: `stat flag ${flags.terminated ? 'on' : ''}`, 'data-stat': 'terminated' }, 'terminated ', h('b', { text: String(flags.terminated) })),
    h('span', { class: `stat flag ${flags.truncated ? 'on' : ''}`, 'data-stat': 'truncated' }, 'truncated ', h('b', { text: String(flags.truncated) })),
    h('span', { class: 'stat', 'data-stat': 'return' }, 'return ', h('b', { text: String(+episodeReturn(index).toFixed(6)) })),
    step.ms !== null ? h('span', { class: 'stat', 'data-stat': 'latency' }, 'latency ', h('b', { text: `${step.ms.toFixed(1)} ms` })) : null,
    ep.imported ? h('span', { class: 'stat pill warn', text: 'imported episode' }) : null,
  );
  clear($('#observation'), obs ? fieldTable(obs, { skip: FLAGS }) : null);
  clear($('#metadata'), obs ? valueView(obs.metadata || {}, 'metadata') : null);
  renderDetail(index);
  renderView(obs, index === ep.steps.length - 1 && !ep.imported);
}

function renderDetail(index) {
  const ep = app.episode;
  const step = ep.steps[index];
  const prev = index > 0 ? lastGood(index - 1) : null;
  const parts = [];
  if (step.kind === 'reset') {
    parts.push(h('p', {}, 'reset with seed ', h('code', { text: String(ep.seed) }), ' and options ', h('code', { text: json(ep.options, 0) })));
  } else {
    parts.push(h('h3', { text: 'action' }), h('pre', { class: 'obj', text: json(mask(step.action)) }));
  }
  if (step.error) {
    parts.push(h('p', { class: 'warn' }, h('span', { class: 'code', text: step.error.code }), ' ', step.error.message));
  }
  if (app.diverged && app.diverged.index === index) {
    parts.push(h('h3', { text: 'replay differs here: recorded → replayed' }), diffView(app.diverged.recorded, app.diverged.replayed));
  }
  if (step.state) {
    parts.push(h('h3', { text: prev && prev !== step ? 'state diff against the previous step' : 'state' }));
    parts.push(prev && prev !== step && prev.state ? diffView(prev.state, step.state) : h('pre', { class: 'obj', text: json(mask(step.state)) }));
  }
  clear($('#detail'), parts);
}

function renderTimeline() {
  const list = $('#timeline');
  if (!app.episode) {
    clear(list);
    return;
  }
  clear(
    list,
    app.episode.steps.map((s, i) => {
      const cls = ['step', s.error ? 'failed' : '', i === app.selected ? 'selected' : '', app.diverged && app.diverged.index === i ? 'diverged' : ''];
      return h(
        'li',
        { class: cls.join(' ') },
        h(
          'button',
          { type: 'button', 'aria-current': i === app.selected ? 'step' : null, onclick: () => select(i) },
          h('span', { class: 'n', text: i === 0 ? 'reset' : `#${i}` }),
          h('span', { class: 'act', text: i === 0 ? `seed ${app.episode.seed ?? '—'}` : short(mask(s.action), 40) }),
          s.error ? h('span', { class: 'code', text: s.error.code }) : h('span', { class: 'r', text: s.reward === null ? '' : `r=${+Number(s.reward).toFixed(4)}` }),
          s.terminated ? h('span', { class: 'flag on', text: 'T' }) : null,
          s.truncated ? h('span', { class: 'flag on', text: 'trunc' }) : null,
          s.ms !== null && s.ms !== undefined ? h('span', { class: 'ms', text: `${s.ms.toFixed(1)}ms` }) : null,
        ),
      );
    }),
  );
}

function select(index) {
  app.selected = index;
  render();
}

let viewToken = 0;
async function renderView(obs, latest) {
  const frame = $('#env-view');
  const quick = $('#quick-actions');
  const ticket = ++viewToken;
  if (!obs || !(app.hooks.render_html || app.hooks.web_actions)) {
    frame.hidden = true;
    clear(quick);
    return;
  }
  try {
    const view = await http('render', { method: 'POST', body: { observation: obs } });
    if (ticket !== viewToken) return;
    frame.hidden = view.html === null;
    if (view.html !== null) frame.srcdoc = view.html;
    clear(
      quick,
      latest
        ? view.actions.map((a) => h('button', { type: 'button', class: 'quick', onclick: () => doStep(a.action), text: a.label }))
        : null,
    );
  } catch (e) {
    frame.hidden = true;
    clear(quick, h('p', { class: 'warn', text: `view unavailable: ${e.code} ${e.message}` }));
  }
}

// -- shareable link, export, import, verify ------------------------------------------

function updateLink() {
  const ep = app.episode;
  if (!ep || ep.imported) return;
  const params = new URLSearchParams();
  if (ep.seed !== null) params.set('seed', String(ep.seed));
  if (Object.keys(ep.options).length) params.set('options', JSON.stringify(ep.options));
  params.set('actions', JSON.stringify(ep.steps.slice(1).map((s) => s.action)));
  history.replaceState(null, '', `#${params}`);
}

function linkEpisode() {
  const params = new URLSearchParams(location.hash.slice(1));
  if (!params.has('actions') && !params.has('seed')) return null;
  try {
    return {
      seed: params.has('seed') ? Number(params.get('seed')) : null,
      options: JSON.parse(params.get('options') || '{}'),
      actions: JSON.parse(params.get('actions') || '[]'),
    };
  } catch {
    note('the link does not hold a readable episode', 'warn');
    return null;
  }
}

async function replay(seed, options, actions) {
  $('#seed').value = seed === null ? '' : String(seed);
  if (app.optionsForm) app.optionsForm.value = options;
  await doReset(seed, options);
  for (const action of actions) await doStep(action);
}

// The environment's identity from the corral/1 welcome, which every server sends; /schema
// and /metadata are OpenEnv's bodies (no contract version or fingerprint) when the server
// serves an OpenEnv environment, so they are only the fallback.
function identity() {
  return { ...app.metadata, ...(app.wire?.welcome?.env || {}) };
}

function meta() {
  const server = app.wire?.welcome || {};
  const env = identity();
  return { env: env.name, contract_version: env.contract_version, fingerprint: env.fingerprint, server: server.server, url: new URL('..', location.href).href.replace(/\/$/, ''), session: app.session?.id ?? null };
}

async function verify(ep) {
  const session = await Session.open(app.wire);
  try {
    const compare = (i, step, reply, error) => {
      if (step.error || error) {
        if ((step.error?.code ?? null) !== (error?.code ?? null)) {
          return { index: i, recorded: step.error ?? step.observation, replayed: error ? { code: error.code, message: error.message } : reply.observation };
        }
        return null;
      }
      return equal(step.observation, reply.observation) ? null : { index: i, recorded: step.observation, replayed: reply.observation };
    };
    for (let i = 0; i < ep.steps.length; i++) {
      const step = ep.steps[i];
      let reply = null;
      let error = null;
      try {
        reply = (i === 0 ? await session.reset(ep.seed, ep.options) : await session.step(step.action)).reply;
      } catch (e) {
        if (!(e instanceof WireError)) throw e;
        error = e;
      }
      const differs = compare(i, step, reply, error);
      if (differs) return differs;
    }
    return null;
  } finally {
    await session.close().catch(() => {});
  }
}

async function doVerify() {
  const ep = app.episode;
  if (!ep || app.busy) return;
  setBusy(true);
  note('re-running the episode in a fresh session…');
  try {
    const differs = await verify(ep);
    app.diverged = differs;
    if (differs) {
      const fields = diff(differs.recorded, differs.replayed).map((c) => c.path.join('.') || '(value)');
      note(`not deterministic: step ${differs.index} differs (${fields.slice(0, 4).join(', ')})`, 'bad verify-result');
      app.selected = differs.index;
    } else {
      note(`deterministic: all ${ep.steps.length} observations identical on a fresh session`, 'ok verify-result');
    }
    render();
  } catch (e) {
    note(`could not verify: ${e.code || ''} ${e.message}`, 'bad');
  } finally {
    setBusy(false);
  }
}

// The server writes the module (corral.regression, the template `corral replay --pytest`
// uses) from the episode file this page would export.
async function exportPytest() {
  if (!app.episode) return;
  const url = encodeURIComponent(meta().url);
  try {
    const source = await authed(() =>
      http(`regression?url=${url}`, { method: 'POST', body: toJsonl(app.episode, meta()), headers: { 'Content-Type': 'application/x-ndjson' } }),
    );
    download(`test_${(app.metadata?.name || 'env').replace(/\W/g, '_')}_episode.py`, source, 'text/x-python');
  } catch (e) {
    note(`could not export: ${e.code || ''} ${e.message}`, 'bad');
  }
}

async function doImport(file) {
  try {
    const episodes = fromJsonl(await file.text());
    if (!episodes.length) throw new Error('the file holds no episode');
    const ep = episodes[0];
    app.episode = { ...ep, imported: true };
    app.selected = 0;
    app.diverged = null;
    render();
    note('');
    clear(
      $('#import-note'),
      h(
        'p',
        {},
        `imported ${file.name}: ${ep.steps.length - 1} steps, seed ${ep.seed ?? '—'}${episodes.length > 1 ? ` (first of ${episodes.length} episodes)` : ''}. `,
        h('button', { type: 'button', id: 'replay-imported', onclick: () => replay(ep.seed, ep.options, ep.steps.slice(1).map((s) => s.action)) }, 'Replay in this session'),
      ),
    );
    setBusy(false);
  } catch (e) {
    note(`cannot import ${file.name}: ${e.message}`, 'bad');
  }
}

// -- tools ---------------------------------------------------------------------------

let rpcId = 0;
async function rpc(method, params, session) {
  const headers = session ? { 'X-Corral-Session': session } : {};
  return http('mcp', { method: 'POST', body: { jsonrpc: '2.0', id: ++rpcId, method, params }, headers });
}

async function loadTools() {
  const reply = await rpc('tools/list', {}).catch(() => null);
  app.tools = reply?.result?.tools || [];
  $('#tools-card').hidden = app.tools.length === 0;
  if (!app.tools.length) return;
  clear($('#tool-select'), app.tools.map((t, i) => h('option', { value: String(i), text: t.name })));
  $('#tool-select').onchange = showTool;
  showTool();
}

function showTool() {
  const tool = app.tools[Number($('#tool-select').value)];
  $('#tool-description').textContent = tool.description || '';
  app.toolForm = new FormWithJson(tool.inputSchema || { type: 'object', properties: {} }, { id: 'tool', label: tool.name });
  clear($('#tool-form'), app.toolForm.el);
  clear($('#tool-result'));
}

async function callTool() {
  const tool = app.tools[Number($('#tool-select').value)];
  const result = $('#tool-result');
  let args;
  try {
    args = app.toolForm.value;
  } catch (e) {
    clear(result, h('p', { class: 'warn tool-error', text: e.message }));
    return;
  }
  try {
    if (!app.toolSession) app.toolSession = (await http('sessions', { method: 'POST' })).session_id;
    const reply = await rpc('tools/call', { name: tool.name, arguments: args }, app.toolSession);
    if (reply.error) {
      clear(result, h('div', { class: 'warn tool-error', role: 'alert' }, h('span', { class: 'code', text: String(reply.error.code) }), ' ', reply.error.message, reply.error.data ? h('pre', { class: 'obj', text: json(reply.error.data) }) : null));
      return;
    }
    const out = reply.result || {};
    const texts = (out.content || []).map((c) => c.text ?? json(c)).join('\n');
    clear(result, h('div', { class: out.isError ? 'warn tool-error' : 'tool-ok' }, out.isError ? h('span', { class: 'code', text: 'TOOL_ERROR' }) : null, h('pre', { class: 'long', text: out.structuredContent !== undefined ? json(out.structuredContent) : texts })));
  } catch (e) {
    clear(result, h('p', { class: 'warn tool-error', text: `${e.code}: ${e.message}` }));
  }
}

// -- views, keyboard, theme ----------------------------------------------------------

function showView(name) {
  for (const tab of document.querySelectorAll('[role=tab]')) tab.setAttribute('aria-selected', String(tab.dataset.view === name));
  for (const view of document.querySelectorAll('.view')) view.hidden = view.id !== `view-${name}`;
  if (name === 'server') app.server.start();
  else app.server.stop();
}

function onKey(e) {
  const target = e.target;
  const typing = target.closest('input, textarea, select, [contenteditable]');
  if (e.key === 'Enter' && !e.shiftKey && !e.ctrlKey && !e.altKey && !e.metaKey) {
    if (target.tagName === 'TEXTAREA' || target.closest('button, summary, dialog, a, label.button')) return;
    const zone = target.closest('[data-enter]')?.dataset.enter ?? 'step';
    if ($('#view-play').hidden) return;
    e.preventDefault();
    if (zone === 'reset') doReset();
    else if (zone === 'tool') callTool();
    else doStep();
  } else if (e.key === 'r' && !typing && !e.ctrlKey && !e.metaKey && !e.altKey && !$('#view-play').hidden) {
    e.preventDefault();
    doReset();
  }
}

function theme() {
  const root = document.documentElement;
  const dark = root.dataset.theme ? root.dataset.theme === 'dark' : matchMedia('(prefers-color-scheme: dark)').matches;
  root.dataset.theme = dark ? 'light' : 'dark';
  localStorage.setItem('corral-theme', root.dataset.theme);
}

// -- start ---------------------------------------------------------------------------

async function start() {
  const saved = localStorage.getItem('corral-theme');
  if (saved) document.documentElement.dataset.theme = saved;
  app.inspector = new Inspector($('#frames'), $('#frame'));
  app.server = new ServerView($('#server'), () => authed(() => http('status')));
  for (const tab of document.querySelectorAll('[role=tab]')) tab.onclick = () => showView(tab.dataset.view);
  $('#theme').onclick = theme;
  $('#reset').onclick = () => doReset();
  $('#step').onclick = () => doStep();
  $('#close').onclick = closeSession;
  // A resumed session goes on with its episode; a new one starts one.
  $('#open').onclick = () => openSession().then((resumed) => resumed || doReset()).catch((e) => showError(e));
  $('#new-episode').onclick = () => {
    randomSeed();
    doReset();
  };
  $('#verify').onclick = doVerify;
  $('#export').onclick = () => app.episode && download(`${app.metadata?.name || 'episode'}-${Date.now()}.jsonl`, toJsonl(app.episode, meta()), 'application/x-ndjson');
  $('#export-pytest').onclick = exportPytest;
  $('#share').onclick = () => {
    updateLink();
    showSnippet('Link to this episode', location.href);
  };
  $('#import').onchange = (e) => e.target.files[0] && doImport(e.target.files[0]);
  $('#tool-call').onclick = callTool;
  $('#copy-python').onclick = () => app.episode && showSnippet('Python (AsyncEnvClient)', pythonSnippet(app.episode, app.selected, meta()));
  $('#copy-curl').onclick = () => app.episode && showSnippet('curl (HTTP routes)', curlSnippet(app.episode, app.selected, meta()));
  $('#clear-frames').onclick = () => app.inspector.clear();
  document.addEventListener('keydown', onKey);
  addEventListener('pagehide', () => {
    if (app.toolSession) fetch(new URL(`../sessions/${app.toolSession}`, location.href), { method: 'DELETE', keepalive: true });
  });
  setBusy(false);
  try {
    app.metadata = await authed(() => http('metadata'));
    const [schema, hooks] = await Promise.all([http('schema'), http('render').catch(() => app.hooks)]);
    app.schema = schema;
    app.hooks = hooks;
    $('#env-name').textContent = app.metadata.name;
    document.title = `${app.metadata.name} · corral`;
    app.actionForm = new FormWithJson(schema.action, { id: 'action', label: 'action' });
    clear($('#action'), app.actionForm.el);
    const optionsSchema = schema.reset_options || { type: 'object', title: 'options', additionalProperties: true };
    app.optionsForm = new FormWithJson(optionsSchema, { id: 'options', label: 'reset options' });
    clear($('#options'), app.optionsForm.el);
    await openSession();
    $('#env-version').textContent = `contract ${identity().contract_version}`;
    showContract($('#contract'), { schema, identity: identity(), welcome: app.wire.welcome });
    loadTools();
    const linked = linkEpisode();
    if (linked) await replay(linked.seed, linked.options, linked.actions);
    else {
      randomSeed(); // a seeded episode can be shared, exported and verified
      await doReset();
    }
  } catch (e) {
    status(`error: ${e.code || ''} ${e.message}`, 'bad');
    showError(e);
  }
}

start();
