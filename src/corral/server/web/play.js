// The Play view's controller: resets and steps on the connection's session, the episodes
// the tab holds (book.js), the determinism check, restore of an expired session, import,
// export, the shareable link. Its state is its own (a Book, the forms, busy); what it
// needs from elsewhere comes in through the constructor.
//
// Nothing the page did is lost on the way: a step cut by a dropped connection is sent
// again once the session is back (connection.js); a session the server no longer holds
// leaves its episode kept and exportable, with an offer to restore it in a new session.
// With snapshots, each step's is kept: restore uses the last, any step can be branched.

import { h, $, clear, download } from './dom.js';
import { diff, json, sessionLabel, shown } from './values.js';
import { WireError, Session } from './wire.js';
import { flagsOf, pathText } from './observe.js';
import { toJsonl, fromJsonl } from './episode.js';
import { Book } from './book.js';
import { formatLink, parseLink } from './link.js';
import { replayEpisode, restoreEpisode, keepSnapshot, snapshotAt } from './restore.js';
import { sessionGone } from './reconnect.js';
import { renderObservation, renderDetail, renderTimeline, renderPicker } from './playview.js';

// One timeline entry from a reply (or an error).
function record(kind, action, reply, ms, error) {
  const obs = reply ? reply.observation : null;
  const failure = error ? { code: error.code, message: error.message, details: error.details } : null;
  // t: when the request was sent (the episode format's meaning), in ms.
  return { kind, action, observation: obs, ...flagsOf(obs), ms, error: failure, state: null, t: Date.now() - (ms ?? 0) };
}

const plural = (n, word) => `${n} ${word}${n === 1 ? '' : 's'}`;

export class Play {
  // conn: connection.js's Connection; http: wire.js's http (authed); identity(): the env's
  // name, contract version and fingerprint; renderView(obs, latest, onAction): the env's
  // own view (main.js); showError(error, form): the error card.
  constructor({ conn, http, identity, renderView, showError }) {
    this.conn = conn;
    this.http = http;
    this.identity = identity;
    this.renderView = renderView;
    this.showError = showError;
    this.book = new Book();
    this.busy = false;
    this.actionForm = null;
    this.optionsForm = null;
    this.offer = null; // a shared link's episode waiting for the user's word
  }

  // -- small helpers -----------------------------------------------------------------

  note(text, kind = '') {
    clear($('#episode-note'), text ? h('p', { class: kind, text }) : null);
  }

  setBusy(busy) {
    this.busy = busy;
    const live = this.conn.live;
    for (const id of ['#new-episode', '#reset', '#close']) $(id).disabled = busy || !live;
    $('#verify').disabled = busy || !this.conn.wire?.open || !this.book.shown;
    $('#step').disabled = busy || !live || this.book.readOnly;
    const restore = $('#restore');
    if (restore) restore.disabled = busy || !this.conn.live;
  }

  seedValue() {
    const raw = $('#seed').value.trim();
    return raw === '' ? null : Number(raw);
  }

  randomSeed() {
    $('#seed').value = String(Math.floor(Math.random() * 2 ** 31));
  }

  optionsValue() {
    return this.optionsForm ? this.optionsForm.value || {} : {};
  }

  // The episode file's header fields for this tab.
  meta() {
    const env = this.identity();
    return {
      env: env.name,
      contract_version: env.contract_version,
      fingerprint: env.fingerprint,
      server: this.conn.welcome?.server,
      url: new URL('..', location.href).href.replace(/\/$/, ''),
      session: this.conn.session?.id ?? null,
    };
  }

  // -- reset and step ----------------------------------------------------------------

  // Keep the snapshot of step `index` (none on failure: restore then replays).
  async snapshotStep(ep, index, session) {
    if (!this.conn.welcome?.env?.snapshots) return;
    try {
      keepSnapshot(ep, index, await session.snapshot());
    } catch (e) {
      if (!(e instanceof WireError)) throw e;
    }
  }

  async reset(seed = this.seedValue(), options = null) {
    if (this.busy || !this.conn.live) return;
    let opts;
    try {
      opts = options ?? this.optionsValue();
    } catch (e) {
      this.showError(e, this.optionsForm);
      return;
    }
    this.setBusy(true);
    this.showError(null);
    try {
      const session = this.conn.session;
      const { reply, ms } = await session.reset(seed, opts);
      const first = record('reset', null, reply, ms, null);
      first.state = await session.state().catch(() => null);
      const ep = { seed, options: opts, steps: [first], episode: first.state?.episode_id ?? null };
      await this.snapshotStep(ep, 0, session);
      this.book.begin(ep);
      this.note('');
      clear($('#import-note'));
      clear($('#session-banner'));
      this.render();
      this.updateLink();
    } catch (e) {
      if (!this.lostSession(e)) this.showError(e, this.optionsForm);
    } finally {
      this.setBusy(false);
    }
  }

  async step(given) {
    const ep = this.book.live;
    if (this.busy || !this.conn.live || !ep || this.book.readOnly) return;
    let action;
    try {
      action = given ?? this.actionForm.value;
    } catch (e) {
      this.showError(e, this.actionForm);
      return;
    }
    this.setBusy(true);
    this.showError(null);
    this.actionForm.form.clearErrors();
    let entry;
    try {
      const session = this.conn.session;
      const { reply, ms } = await session.step(action);
      entry = record('step', action, reply, ms, null);
      entry.state = await session.state().catch(() => null);
      await this.snapshotStep(ep, ep.steps.length, session);
    } catch (e) {
      if (!(e instanceof WireError)) throw e;
      if (this.lostSession(e)) return;
      entry = record('step', action, null, e.ms ?? null, e);
      this.showError(e, this.actionForm);
    } finally {
      this.setBusy(false);
    }
    ep.steps.push(entry);
    if (this.book.shown === ep) this.book.select(ep.steps.length - 1);
    this.render();
    this.updateLink();
  }

  // A request answered "the session is gone" (reaped while idle, or expired during a
  // drop): treated as the connection's expiry. True when it was that.
  lostSession(error) {
    if (!sessionGone(error)) return false;
    if (this.conn.session) {
      const session = this.conn.session;
      this.conn.session = null;
      this.expired(session, error);
    }
    return true;
  }

  // -- the session went away -----------------------------------------------------------

  // The server no longer holds the session: keep its episode (shown, exportable), say so,
  // open a new session and offer to restore the episode in it.
  async expired(session, error) {
    const ep = this.book.expire(error);
    this.render();
    this.setBusy(false);
    $('#session-info').textContent = 'session expired';
    const steps = ep ? ep.steps.length - 1 : 0;
    const snapshot = ep ? snapshotAt(ep, ep.steps.length - 1) : null;
    clear(
      $('#session-banner'),
      h(
        'div',
        { class: 'banner warn', role: 'alert', 'data-code': error?.code ?? 'SESSION_LOST' },
        h('p', {}, h('b', { text: 'The session expired' }), `: the server no longer holds it (`, h('span', { class: 'code', text: error?.code ?? 'SESSION_LOST' }), ` ${error?.message ?? ''}).`),
        ep
          ? h('p', { text: `Its episode (seed ${ep.seed ?? '—'}, ${plural(steps, 'step')}) is kept here: export it, or restore it in a new session ${snapshot ? "from the server's snapshot of its last step" : 'by replaying its actions and comparing each observation'}.` })
          : null,
        ep && !snapshot && (ep.seed === null || ep.seed === undefined)
          ? h('p', { class: 'hint', text: 'It was reset without a seed: a replay may well give another episode (the comparison will say where).' })
          : null,
        ep ? h('div', { class: 'row buttons' }, h('button', { type: 'button', id: 'restore', class: 'primary', onclick: () => this.restore(ep), text: snapshot ? 'Restore (from its snapshot)' : `Restore (replay ${plural(steps, 'action')})` })) : null,
      ),
    );
    try {
      await this.conn.openSession();
      $('#session-info').textContent = `new session ${sessionLabel(this.conn.session.id)}… (the expired episode is kept)`;
    } catch (e) {
      this.showError(e); // e.g. the server is full: Open session tries again
      $('#open').hidden = false;
    }
    this.setBusy(false);
  }

  resumed() {
    this.setBusy(false);
  }

  // -- replaying into the live session -------------------------------------------------

  // Replay `ep` (seed, options, actions; observations compared where it has them) as the
  // new live episode. `restore` uses the snapshot path when there is one.
  async replayLive(ep, { restore = false } = {}) {
    if (this.busy || !this.conn.live) return null;
    this.setBusy(true);
    this.showError(null);
    const session = this.conn.session;
    const live = { seed: ep.seed, options: ep.options || {}, steps: [], episode: null };
    $('#seed').value = ep.seed === null || ep.seed === undefined ? '' : String(ep.seed);
    if (this.optionsForm) this.optionsForm.value = live.options;
    const onStep = (i, { reply, ms, error, state }) => {
      const entry = record(i === 0 ? 'reset' : 'step', i === 0 ? null : ep.steps[i].action, reply, ms, error);
      entry.state = state;
      live.steps.push(entry);
      if (i === 0) {
        live.episode = state?.episode_id ?? null;
        this.book.begin(live);
      } else {
        this.book.select(live.steps.length - 1);
      }
      this.render();
    };
    try {
      const run = restore ? restoreEpisode : replayEpisode;
      const outcome = await run(session, ep, { onStep, withState: true });
      if (outcome.steps) {
        live.steps = outcome.steps; // restored from a snapshot: nothing was replayed
        live.snapshots = new Map(ep.snapshots);
        await this.conn.adopt(outcome.session);
        this.book.begin(live);
        this.book.select(live.steps.length - 1);
      } else if (!outcome.diverged && live.steps.length) {
        await this.snapshotStep(live, live.steps.length - 1, this.conn.session);
      }
      live.diverged = outcome.diverged;
      if (outcome.diverged) this.book.select(outcome.diverged.index);
      this.render();
      this.updateLink();
      return outcome;
    } catch (e) {
      if (!this.lostSession(e)) this.showError(e);
      return null;
    } finally {
      this.setBusy(false);
    }
  }

  async restore(ep) {
    const steps = ep.steps.length - 1;
    const how = snapshotAt(ep, steps) ? 'from its snapshot' : `replaying ${plural(steps, 'action')}`;
    this.note(`restoring: ${how} in a new session…`);
    const outcome = await this.replayLive(ep, { restore: true });
    if (!outcome) return;
    clear($('#session-banner'));
    const fields = outcome.diverged ? diff(outcome.diverged.recorded, outcome.diverged.replayed).map((c) => pathText(c.path)) : [];
    if (outcome.how === 'snapshot') {
      this.note(`restored from the server's snapshot (${plural(outcome.replayed, 'step')}); the expired episode stays in the list above`, 'ok restore-result');
    } else if (outcome.diverged) {
      this.note(
        `restored up to step ${outcome.diverged.index}: it differs from the recording (${fields.slice(0, 4).join(', ')}), so the replay stopped there; the live episode goes on from the replayed state, the expired one stays in the list above`,
        'bad restore-result',
      );
    } else {
      this.note(`restored: replayed ${plural(outcome.replayed - 1, 'action')} in a new session, every observation identical; the expired episode stays in the list above`, 'ok restore-result');
    }
  }

  // -- branch: a live session from a step's snapshot; the episode left is kept --------
  async branch(ep, index) {
    const envelope = snapshotAt(ep, index);
    if (!envelope || this.busy || !this.conn.live) return;
    this.setBusy(true);
    this.showError(null);
    try {
      const session = await Session.restore(this.conn.wire, envelope);
      const left = this.book.live;
      if (left) this.book.keep(left, 'branched');
      await this.conn.adopt(session);
      const steps = ep.steps.slice(0, index + 1).map((s) => ({ ...s }));
      const branch = { seed: ep.seed, options: ep.options, steps, episode: ep.episode };
      keepSnapshot(branch, index, envelope);
      this.book.begin(branch);
      this.book.select(index);
      $('#session-info').textContent = `session ${sessionLabel(session.id)}… (branched from step ${index})`;
      this.note(`branched from step ${index}: a new session in that exact state`, 'ok branch-result');
      this.render();
      this.updateLink();
    } catch (e) {
      if (!this.lostSession(e)) this.showError(e);
    } finally {
      this.setBusy(false);
    }
  }

  // -- determinism check ---------------------------------------------------------------

  async verify() {
    const ep = this.book.shown;
    if (!ep || this.busy || !this.conn.wire?.open) return;
    this.setBusy(true);
    this.note('re-running the episode in a fresh session…');
    let session = null;
    try {
      session = await Session.open(this.conn.wire);
      const { diverged } = await replayEpisode(session, ep);
      ep.diverged = diverged;
      if (diverged) {
        const fields = diff(diverged.recorded, diverged.replayed).map((c) => pathText(c.path));
        this.note(`not deterministic: step ${diverged.index} differs (${fields.slice(0, 4).join(', ')})`, 'bad verify-result');
        this.book.select(diverged.index);
      } else {
        this.note(`deterministic: all ${ep.steps.length} observations identical on a fresh session`, 'ok verify-result');
      }
      this.render();
    } catch (e) {
      this.note(`could not verify: ${e.code || ''} ${e.message}`, 'bad');
    } finally {
      if (session) await session.close().catch(() => {});
      this.setBusy(false);
    }
  }

  // -- rendering -----------------------------------------------------------------------

  render() {
    const { book } = this;
    const ep = book.shown;
    renderPicker(book.entries(), ep, (picked) => {
      book.show(picked, picked.steps.length - 1);
      this.render();
      this.setBusy(false);
    });
    renderTimeline(ep, book.selected, (i) => {
      book.select(i);
      this.render();
    });
    if (!ep) return;
    const obs = renderObservation(ep, book.selected);
    renderDetail(ep, book.selected);
    const at = book.selected;
    if (snapshotAt(ep, at)) {
      $('#detail').append(h('button', { type: 'button', id: 'branch', disabled: this.busy || !this.conn.live, onclick: () => this.branch(ep, at), text: 'Branch from this step' }));
    }
    this.renderView(obs, book.selected === ep.steps.length - 1 && !book.readOnly, (action) => this.step(action));
  }

  // -- shareable link ------------------------------------------------------------------

  updateLink() {
    const ep = this.book.live;
    if (!ep || this.offer) return;
    history.replaceState(null, '', `#${formatLink({ seed: ep.seed, options: ep.options, actions: ep.steps.slice(1).map((s) => s.action) })}`);
  }

  // A link with an episode is someone else's data: show what it would send and replay
  // nothing until the user says so.
  offerLink(fragment) {
    const linked = parseLink(fragment);
    if (!linked) return;
    const box = $('#link-offer');
    if (linked.error) {
      clear(box, h('p', { class: 'warn', role: 'alert', text: `the link does not hold a readable episode: ${linked.error}` }));
      return;
    }
    this.offer = linked;
    const dismiss = () => {
      this.offer = null;
      clear(box);
      box.hidden = true;
      this.updateLink();
    };
    box.hidden = false;
    clear(
      box,
      h('h2', { id: 'h-link', text: 'A link with an episode' }),
      h('p', { text: `Replaying it resets with seed ${linked.seed ?? '(none)'} and sends these ${plural(linked.actions.length, 'action')} to the server as you. Check them first.` }),
      Object.keys(linked.options).length ? h('p', {}, 'reset options ', h('code', { text: json(shown(linked.options), 0) })) : null,
      h('ol', { class: 'link-actions', start: 1 }, linked.actions.map((a) => h('li', {}, h('code', { text: json(shown(a), 0) })))),
      h(
        'div',
        { class: 'row buttons' },
        h('button', {
          type: 'button',
          id: 'link-replay',
          class: 'primary',
          text: `Replay ${plural(linked.actions.length, 'action')}`,
          onclick: async () => {
            dismiss();
            const steps = [{ kind: 'reset' }, ...linked.actions.map((action) => ({ kind: 'step', action }))];
            await this.replayLive({ seed: linked.seed, options: linked.options, steps });
          },
        }),
        h('button', { type: 'button', id: 'link-ignore', text: 'Ignore', onclick: dismiss }),
      ),
    );
  }

  // -- episode files -------------------------------------------------------------------

  exportJsonl() {
    const ep = this.book.shown;
    if (!ep) return;
    download(`${this.identity().name || 'episode'}-${Date.now()}.jsonl`, toJsonl(ep, this.meta()), 'application/x-ndjson');
  }

  // The server writes the module (corral.regression, the template `corral replay --pytest`
  // uses) from the episode file this page would export; it fills in the environment's
  // target when it has an importable one, so the test starts its own server.
  async exportPytest() {
    const ep = this.book.shown;
    if (!ep) return;
    const url = encodeURIComponent(this.meta().url);
    try {
      const { data, headers } = await this.http(`regression?url=${url}`, {
        method: 'POST',
        body: toJsonl(ep, this.meta()),
        headers: { 'Content-Type': 'application/x-ndjson' },
        withHeaders: true,
      });
      const name = `test_${(this.identity().name || 'env').replace(/\W/g, '_')}_episode.py`;
      download(name, data, 'text/x-python');
      const target = headers.get('X-Corral-Env-Target');
      this.note(
        target
          ? `exported ${name}: it starts ${target} in a server of its own ($CORRAL_URL, when set, is used instead)`
          : `exported ${name}: it replays against ${this.meta().url} or $CORRAL_URL (this environment cannot be imported by name, so the test cannot start one itself)`,
        'export-result',
      );
    } catch (e) {
      this.note(`could not export: ${e.code || ''} ${e.message}`, 'bad');
    }
  }

  async importFile(file) {
    let episodes;
    try {
      episodes = fromJsonl(await file.text());
      if (!episodes.length) throw new Error('the file holds no episode');
    } catch (e) {
      this.note(`cannot import ${file.name}: ${e.message}`, 'bad');
      return;
    }
    const { listed, of } = this.book.importFile(episodes, file.name);
    this.render();
    this.note('');
    const first = this.book.shown;
    const count = of > 1 ? ` — ${plural(of, 'episode')}${listed < of ? `, the first ${listed} listed` : ''}: pick one in the list above` : '';
    clear(
      $('#import-note'),
      h(
        'p',
        {},
        `imported ${file.name}: ${plural(first.steps.length - 1, 'step')}, seed ${first.seed ?? '—'}${count}. `,
        h('button', { type: 'button', id: 'replay-imported', onclick: () => this.book.shown && this.replayLive(this.book.shown), text: 'Replay in this session' }),
      ),
    );
    this.setBusy(false);
  }
}
