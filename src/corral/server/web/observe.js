// Observations: the field table, arrays drawn on a <canvas>, long text as <pre>, diffs.

import { h, json, short, diff, mask } from './dom.js';

export const FLAGS = ['done', 'truncated', 'reward', 'metadata'];

const isArray = (v) =>
  v !== null && typeof v === 'object' && typeof v.dtype === 'string' && Array.isArray(v.shape) && typeof v.data === 'string';

function bytes(b64) {
  const text = atob(b64);
  const out = new Uint8Array(text.length);
  for (let i = 0; i < text.length; i++) out[i] = text.charCodeAt(i);
  return out;
}

// Draw a uint8 H×W, H×W×1, H×W×3 or H×W×4 array; returns the canvas, or null for others.
export function arrayCanvas(value, label = 'array') {
  if (!isArray(value) || !['|u1', 'u1', 'uint8', '<u1'].includes(value.dtype)) return null;
  const [height, width, channels = 1] = value.shape;
  if (value.shape.length < 2 || value.shape.length > 3 || ![1, 3, 4].includes(channels)) return null;
  const data = bytes(value.data);
  if (data.length !== height * width * channels || !height || !width) return null;
  const canvas = h('canvas', { width, height, class: 'array', role: 'img', 'aria-label': `${label}: ${height}×${width}×${channels} image` });
  const image = new ImageData(width, height);
  for (let p = 0; p < width * height; p++) {
    const o = p * 4;
    const i = p * channels;
    image.data[o] = data[i];
    image.data[o + 1] = channels >= 3 ? data[i + 1] : data[i];
    image.data[o + 2] = channels >= 3 ? data[i + 2] : data[i];
    image.data[o + 3] = channels === 4 ? data[i + 3] : 255;
  }
  canvas.getContext('2d').putImageData(image, 0, 0);
  const scale = Math.max(1, Math.floor(256 / Math.max(width, height)));
  canvas.style.width = `${width * scale}px`;
  canvas.style.height = `${height * scale}px`;
  return canvas;
}

function arrayBadge(value) {
  return h('span', { class: 'badge', text: `${value.dtype} (${value.shape.join('×')})` });
}

export function valueView(value, label) {
  if (isArray(value)) {
    const canvas = arrayCanvas(value, label);
    return h('div', { class: 'arr' }, arrayBadge(value), canvas || h('code', { text: short(value.data, 40) }));
  }
  if (typeof value === 'string' && (value.length > 80 || value.includes('\n'))) {
    return h('pre', { class: 'long', text: value });
  }
  if (value !== null && typeof value === 'object') {
    return h('pre', { class: 'obj', text: json(value, Array.isArray(value) && value.every((x) => typeof x !== 'object') ? 0 : 1) });
  }
  return h('code', { text: value === undefined ? '' : JSON.stringify(value) });
}

export function fieldTable(obj, { skip = [], caption, plain = false } = {}) {
  const rows = Object.entries(mask(obj || {}))
    .filter(([key]) => !skip.includes(key))
    .map(([key, value]) =>
      h('tr', { 'data-field': key }, h('th', { scope: 'row', text: key }), h('td', {}, plain && typeof value === 'string' ? value : valueView(value, key))),
    );
  return h('table', { class: 'fields-table' }, caption ? h('caption', { text: caption }) : null, h('tbody', {}, rows));
}

export function flagsOf(obs) {
  const done = Boolean(obs && obs.done);
  const truncated = Boolean(obs && obs.truncated);
  return { reward: obs ? obs.reward ?? null : null, terminated: done && !truncated, truncated };
}

export function diffView(before, after, { empty = 'no change' } = {}) {
  const changes = diff(mask(before), mask(after));
  if (!changes.length) return h('p', { class: 'hint', text: empty });
  return h(
    'table',
    { class: 'diff' },
    h('thead', {}, h('tr', {}, h('th', { text: 'path' }), h('th', { text: 'before' }), h('th', { text: 'after' }))),
    h(
      'tbody',
      {},
      changes.map((c) =>
        h(
          'tr',
          {},
          h('td', {}, h('code', { text: c.path.join('.') || '(value)' })),
          h('td', { class: 'before' }, h('code', { text: c.before === undefined ? '—' : short(c.before, 80) })),
          h('td', { class: 'after' }, h('code', { text: c.after === undefined ? '—' : short(c.after, 80) })),
        ),
      ),
    ),
  );
}

// Tiny SVG line chart for the server view.
export function sparkline(values, { width = 160, height = 32, label = '' } = {}) {
  const ns = 'http://www.w3.org/2000/svg';
  const svg = document.createElementNS(ns, 'svg');
  svg.setAttribute('viewBox', `0 0 ${width} ${height}`);
  svg.setAttribute('width', width);
  svg.setAttribute('height', height);
  svg.setAttribute('role', 'img');
  svg.setAttribute('aria-label', label);
  svg.classList.add('spark');
  const points = values.map((v, i) => [i, v ?? 0]);
  const max = Math.max(1e-12, ...points.map(([, v]) => v));
  const step = points.length > 1 ? width / (points.length - 1) : 0;
  const line = document.createElementNS(ns, 'polyline');
  line.setAttribute('points', points.map(([i, v]) => `${(i * step).toFixed(1)},${(height - 2 - (v / max) * (height - 4)).toFixed(1)}`).join(' '));
  svg.append(line);
  return svg;
}
