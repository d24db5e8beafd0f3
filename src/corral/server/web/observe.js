// Observations: the field table, arrays as numbers (a list, a grid, an image), long text
// as <pre>, diffs.

import { h } from './dom.js';
import { json, short, diff, mask } from './values.js';
import { isArrayValue, decodeArray, layoutOf, gridOf, pixelsOf, plain, nestedText, describeArray, CAP, GRID } from './arrays.js';

export const FLAGS = ['done', 'truncated', 'reward', 'metadata'];

const count = (n) => n.toLocaleString('en-US');

function cutNote(text) {
  return h('p', { class: 'hint cut', role: 'note', text });
}

// An RGBA image on a <canvas>, scaled up with crisp pixels.
function canvasOf(pixels, label) {
  const { width, height, channels, rgba } = pixels;
  const canvas = h('canvas', { width, height, class: 'array', role: 'img', 'aria-label': `${label}: ${height}×${width}×${channels} image` });
  canvas.getContext('2d').putImageData(new ImageData(rgba, width, height), 0, 0);
  const scale = Math.max(1, Math.floor(256 / Math.max(width, height)));
  canvas.style.width = `${width * scale}px`;
  canvas.style.height = `${height * scale}px`;
  return canvas;
}

// Draw a uint8 H×W, H×W×1, H×W×3 or H×W×4 array; returns the canvas, or null for others.
export function arrayCanvas(value, label = 'array') {
  if (!isArrayValue(value)) return null;
  const pixels = pixelsOf(value);
  return pixels.error ? null : canvasOf(pixels, label);
}

function gridTable(value, label) {
  const grid = gridOf(value);
  if (grid.error) return [cutNote(grid.error)];
  const table = h(
    'table',
    { class: 'grid', 'aria-label': `${label}: ${value.shape.join('×')} grid` },
    h('tbody', {}, grid.cells.map((row) => h('tr', {}, row.map((cell) => h('td', { text: String(cell) }))))),
  );
  const parts = [table];
  if (grid.cut) parts.push(cutNote(`showing ${grid.rows} of ${count(grid.ofRows)} rows × ${grid.cols} of ${count(grid.ofCols)} columns`));
  return parts;
}

function numbers(value) {
  const decoded = decodeArray(value, CAP);
  if (decoded.error) return [cutNote(decoded.error)];
  const text = h('pre', { class: 'obj array-values', text: nestedText(plain(value, CAP)) });
  return decoded.cut ? [text, cutNote(`showing the first values of ${count(decoded.count)} (at most ${count(CAP)})`)] : [text];
}

// An array as numbers: a list, a grid for 2-D, an image for H×W×1/3/4 uint8 (its numbers a
// click away), nested lists otherwise; cut to a size the page can show, saying so.
export function arrayView(value, label = 'array') {
  const layout = layoutOf(value);
  const parts = [h('span', { class: 'badge', text: describeArray(value) })];
  if (layout === 'image') {
    const canvas = arrayCanvas(value, label);
    parts.push(canvas || cutNote(pixelsOf(value).error));
    parts.push(h('details', { class: 'array-numbers' }, h('summary', { text: 'numbers' }), numbers(value)));
  } else if (layout === 'grid') {
    parts.push(...gridTable(value, label));
    const [height, width] = value.shape;
    const big = height > GRID.rows || width > GRID.cols;
    const canvas = big ? arrayCanvas(value, label) : null; // a large uint8 plane: its picture too
    if (canvas) parts.push(canvas);
  } else if (layout === 'scalar') {
    const decoded = decodeArray(value, 1);
    parts.push(decoded.error ? cutNote(decoded.error) : h('code', { text: JSON.stringify(decoded.values[0]) }));
  } else {
    parts.push(...numbers(value));
  }
  return h('div', { class: `arr arr-${layout}`, 'data-layout': layout }, parts);
}

export function valueView(value, label) {
  if (isArrayValue(value)) return arrayView(value, label);
  if (typeof value === 'string' && (value.length > 80 || value.includes('\n'))) {
    return h('pre', { class: 'long', text: value });
  }
  if (value !== null && typeof value === 'object') {
    const shownValue = plain(value);
    return h('pre', { class: 'obj', text: json(shownValue, Array.isArray(shownValue) && shownValue.every((x) => typeof x !== 'object') ? 0 : 1) });
  }
  return h('code', { text: value === undefined ? '' : JSON.stringify(value) });
}

export function fieldTable(obj, { skip = [], caption, asText = false } = {}) {
  const rows = Object.entries(mask(obj || {}))
    .filter(([key]) => !skip.includes(key))
    .map(([key, value]) =>
      h('tr', { 'data-field': key }, h('th', { scope: 'row', text: key }), h('td', {}, asText && typeof value === 'string' ? value : valueView(value, key))),
    );
  return h('table', { class: 'fields-table' }, caption ? h('caption', { text: caption }) : null, h('tbody', {}, rows));
}

export function flagsOf(obs) {
  const done = Boolean(obs && obs.done);
  const truncated = Boolean(obs && obs.truncated);
  return { reward: obs ? obs.reward ?? null : null, terminated: done && !truncated, truncated };
}

// A diff path as people write it: fields dotted, array elements in brackets.
export const pathText = (path) => path.reduce((text, seg) => (typeof seg === 'number' ? `${text}[${seg}]` : text ? `${text}.${seg}` : String(seg)), '') || '(value)';

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
          h('td', {}, h('code', { text: pathText(c.path) })),
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
