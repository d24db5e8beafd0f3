// The episodes a tab holds: the live one (played on the session) and the ones it keeps
// to look at — every episode of an imported file, and a live episode whose session the
// server no longer holds (kept, never dropped, until the user closes the tab). One of
// them is shown; only the live one takes steps. Pure: no DOM, no globals.

import { describe } from './episode.js';

export const MAX_KEPT = 1000;
// Episodes kept at most; an imported file with more lists its first ones, saying so.

export class Book {
  constructor() {
    this.live = null;
    this.kept = [];
    this.shown = null;
    this.selected = -1;
  }

  get readOnly() {
    return this.shown === null || this.shown !== this.live;
  }

  show(ep, selected = 0) {
    this.shown = ep;
    this.selected = ep ? Math.min(Math.max(selected, 0), ep.steps.length - 1) : -1;
  }

  // A new live episode (after a reset), shown; the previous live one is replaced.
  begin(ep) {
    this.live = ep;
    this.show(ep, 0);
  }

  // The live episode's session is gone: keep the episode, marked, and show it.
  expire(error, at = Date.now()) {
    const ep = this.live;
    if (!ep) return null;
    ep.expired = { code: error?.code ?? 'SESSION_LOST', message: error?.message ?? '', at };
    this.live = null;
    this.keep(ep, 'expired');
    this.show(ep, ep.steps.length - 1);
    return ep;
  }

  keep(ep, why) {
    ep.kept = why;
    if (!this.kept.includes(ep)) this.kept.push(ep);
    // The oldest kept ones go first, never an expired one the user has not dealt with.
    while (this.kept.length > MAX_KEPT) {
      const drop = this.kept.findIndex((k) => k.kept !== 'expired');
      this.kept.splice(drop < 0 ? 0 : drop, 1);
    }
  }

  // The episodes of an imported file (at most MAX_KEPT of them), the first shown.
  // Returns {listed, of}.
  importFile(episodes, name) {
    const listed = episodes.slice(0, MAX_KEPT);
    for (const ep of listed) {
      ep.imported = true;
      ep.file = name;
      this.keep(ep, 'imported');
    }
    if (listed.length) this.show(listed[0], 0);
    return { listed: listed.length, of: episodes.length };
  }

  // The picker's entries: the live episode, then the kept ones, each {ep, label}.
  entries() {
    const out = [];
    if (this.live) out.push({ ep: this.live, label: `live · ${describe(this.live)}` });
    for (const ep of this.kept) {
      const why = ep.kept === 'expired' ? 'expired session' : ep.kept === 'branched' ? 'left for a branch' : `imported ${ep.file ?? ''}`.trim();
      out.push({ ep, label: `${why} · ${describe(ep)}` });
    }
    return out;
  }

  select(index) {
    if (this.shown) this.selected = Math.min(Math.max(index, 0), this.shown.steps.length - 1);
  }
}
