// The Play view drawn from an episode: summary, observation, step detail, timeline and the
// episode picker. Functions of what they are given (an episode, a step index); they keep
// no state and send nothing.

import { h, $, clear } from './dom.js';
import { json, short, shown } from './values.js';
import { FLAGS, fieldTable, flagsOf, diffView, valueView } from './observe.js';

export function episodeReturn(ep, upTo) {
  let total = 0;
  for (const s of ep.steps.slice(1, upTo + 1)) total += s.error ? 0 : Number(s.reward || 0);
  return total;
}

// The last step at or before `index` that has an observation (a failed step shows the
// observation it left in place).
export function lastGood(ep, index) {
  for (let i = index; i >= 0; i--) if (!ep.steps[i].error) return ep.steps[i];
  return null;
}

const badge = (ep) => (ep.expired ? 'expired session' : ep.imported ? 'imported episode' : null);

export function renderObservation(ep, index) {
  const step = ep.steps[index];
  const seen = step.error ? lastGood(ep, index) : step;
  const obs = seen ? seen.observation : null;
  $('#obs-step').textContent = index === 0 ? 'after reset' : `after step ${index}${step.error ? ' (failed)' : ''}`;
  const flags = flagsOf(obs);
  const label = badge(ep);
  clear(
    $('#summary'),
    h('span', { class: 'stat', 'data-stat': 'reward' }, 'reward ', h('b', { text: flags.reward === null ? '—' : String(+Number(flags.reward).toFixed(6)) })),
    h('span', { class: `stat flag ${flags.terminated ? 'on' : ''}`, 'data-stat': 'terminated' }, 'terminated ', h('b', { text: String(flags.terminated) })),
    h('span', { class: `stat flag ${flags.truncated ? 'on' : ''}`, 'data-stat': 'truncated' }, 'truncated ', h('b', { text: String(flags.truncated) })),
    h('span', { class: 'stat', 'data-stat': 'return' }, 'return ', h('b', { text: String(+episodeReturn(ep, index).toFixed(6)) })),
    step.ms !== null && step.ms !== undefined ? h('span', { class: 'stat', 'data-stat': 'latency' }, 'latency ', h('b', { text: `${step.ms.toFixed(1)} ms` })) : null,
    label ? h('span', { class: 'stat pill warn', text: label }) : null,
  );
  clear($('#observation'), obs ? fieldTable(obs, { skip: FLAGS }) : null);
  clear($('#metadata'), obs ? valueView(obs.metadata || {}, 'metadata') : null);
  return obs;
}

export function renderDetail(ep, index) {
  const step = ep.steps[index];
  const prev = index > 0 ? lastGood(ep, index - 1) : null;
  // What changed first (a divergence, the state diff), then what was sent: the action is
  // in the timeline already, and the card sits below the observation.
  const parts = [];
  if (step.error) {
    parts.push(h('p', { class: 'warn' }, h('span', { class: 'code', text: step.error.code }), ' ', step.error.message));
  }
  if (ep.diverged && ep.diverged.index === index) {
    parts.push(h('h3', { text: 'replay differs here: recorded → replayed' }), diffView(ep.diverged.recorded, ep.diverged.replayed));
  }
  if (step.state) {
    const against = prev && prev !== step && prev.state;
    parts.push(h('h3', { text: against ? 'state diff against the previous step' : 'state' }));
    parts.push(against ? diffView(prev.state, step.state) : h('pre', { class: 'obj', text: json(shown(step.state)) }));
  }
  if (step.kind === 'reset') {
    parts.push(h('p', {}, 'reset with seed ', h('code', { text: String(ep.seed) }), ' and options ', h('code', { text: json(shown(ep.options), 0) })));
  } else {
    parts.push(h('h3', { text: 'action' }), h('pre', { class: 'obj', text: json(shown(step.action)) }));
  }
  clear($('#detail'), parts);
}

export function renderTimeline(ep, selected, onSelect) {
  const list = $('#timeline');
  if (!ep) {
    clear(list);
    return;
  }
  clear(
    list,
    ep.steps.map((s, i) => {
      const cls = ['step', s.error ? 'failed' : '', i === selected ? 'selected' : '', ep.diverged && ep.diverged.index === i ? 'diverged' : ''];
      return h(
        'li',
        { class: cls.join(' ') },
        h(
          'button',
          { type: 'button', 'aria-current': i === selected ? 'step' : null, onclick: () => onSelect(i) },
          h('span', { class: 'n', text: i === 0 ? 'reset' : `#${i}` }),
          h('span', { class: 'act', text: i === 0 ? `seed ${ep.seed ?? '—'}` : short(shown(s.action), 40) }),
          s.error ? h('span', { class: 'code', text: s.error.code }) : h('span', { class: 'r', text: s.reward === null || s.reward === undefined ? '' : `r=${+Number(s.reward).toFixed(4)}` }),
          s.terminated ? h('span', { class: 'flag on', text: 'T' }) : null,
          s.truncated ? h('span', { class: 'flag on', text: 'trunc' }) : null,
          s.ms !== null && s.ms !== undefined ? h('span', { class: 'ms', text: `${s.ms.toFixed(1)}ms` }) : null,
        ),
      );
    }),
  );
}

// The episode picker: shown when the tab holds more than the live episode.
export function renderPicker(entries, current, onPick) {
  const picker = $('#episode-pick');
  picker.hidden = entries.length < 2;
  const select = $('#episode-select');
  clear(select, entries.map((entry, i) => h('option', { value: String(i), text: entry.label, selected: entry.ep === current })));
  select.onchange = () => onPick(entries[Number(select.value)].ep);
}
