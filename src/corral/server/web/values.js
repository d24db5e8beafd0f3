// JSON values as the page compares and shows them: equality, leaf differences (arrays
// compared element by element), secret masking, short text. Pure: no DOM, no globals.

import { isArrayValue, decodeArray, unravel, plain, CAP } from './arrays.js';

export const json = (value, indent = 2) => JSON.stringify(value, null, indent);

// One line of at most `max` characters (arrays as their numbers), "…" where it was cut.
export function short(value, max = 60) {
  const text = typeof value === 'string' ? value : JSON.stringify(plain(value, Math.max(1, max)));
  if (text === undefined) return '';
  return text.length > max ? text.slice(0, max - 1) + '…' : text;
}

// Deep equality of JSON values (key order ignored).
export function equal(a, b) {
  if (a === b) return true;
  if (typeof a !== typeof b || a === null || b === null || typeof a !== 'object') return false;
  if (Array.isArray(a) !== Array.isArray(b)) return false;
  const ka = Object.keys(a);
  const kb = Object.keys(b);
  return ka.length === kb.length && ka.every((k) => Object.hasOwn(b, k) && equal(a[k], b[k]));
}

// Two arrays of one dtype and shape differ element by element: each changed element is
// a leaf at its multi-index. Null when they cannot be compared so (then the whole value
// is one leaf).
function arrayDiff(before, after, path, out, limit) {
  if (!isArrayValue(before) || !isArrayValue(after)) return null;
  if (before.dtype !== after.dtype || before.shape.join() !== after.shape.join()) return null;
  const a = decodeArray(before, limit);
  const b = decodeArray(after, limit);
  if (a.error || b.error || a.cut) return null;
  a.values.forEach((v, i) => {
    if (!equal(v, b.values[i])) out.push({ path: [...path, ...unravel(i, before.shape)], before: v, after: b.values[i] });
  });
  return out;
}

// The leaf-level differences between two JSON values: [{path, before, after}].
export function diff(before, after, path = [], out = [], limit = CAP) {
  if (equal(before, after)) return out;
  if (arrayDiff(before, after, path, out, limit)) return out;
  const objects = (v) => v !== null && typeof v === 'object' && !isArrayValue(v);
  if (objects(before) && objects(after) && Array.isArray(before) === Array.isArray(after)) {
    const keys = new Set([...Object.keys(before), ...Object.keys(after)]);
    const list = Array.isArray(before);
    for (const key of keys) diff(before[key], after[key], [...path, list ? Number(key) : key], out, limit);
    return out;
  }
  out.push({ path, before, after });
  return out;
}

// Secret-looking keys (api_key, password, token, ...) are shown masked wherever the page
// displays a value; unmask() puts the real values back into what was typed over a mask.
export const SECRET = /secret|passw(or)?d|token|api[-_]?key|credential|private[-_]?key/i;
export const MASK = '••••••';

export function mask(value, key = '') {
  if (SECRET.test(key) && typeof value === 'string' && value !== '') return MASK;
  if (Array.isArray(value)) return value.map((v) => mask(v));
  if (value !== null && typeof value === 'object') {
    return Object.fromEntries(Object.entries(value).map(([k, v]) => [k, mask(v, k)]));
  }
  return value;
}

export function unmask(typed, real) {
  if (typed === MASK) return real;
  if (Array.isArray(typed)) return typed.map((v, i) => unmask(v, Array.isArray(real) ? real[i] : undefined));
  if (typed !== null && typeof typed === 'object') {
    const source = real !== null && typeof real === 'object' ? real : {};
    return Object.fromEntries(Object.entries(typed).map(([k, v]) => [k, unmask(v, source[k])]));
  }
  return typed;
}

// A value as the page shows it in text: secrets masked, arrays as numbers.
export const shown = (value) => plain(mask(value));

// A session id's label: 8 characters of its random part (`<server>~<random>~<tag>`).
export function sessionLabel(id) {
  const parts = String(id).split('~');
  return (parts.length === 3 ? parts[1] : String(id)).slice(0, 8);
}
