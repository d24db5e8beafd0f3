// Tiny DOM helpers: h() builds elements; nothing here touches the network.

export function h(tag, attrs = {}, ...children) {
  const el = document.createElement(tag);
  for (const [key, value] of Object.entries(attrs)) {
    if (value === undefined || value === null || value === false) continue;
    if (key === 'class') el.className = value;
    else if (key === 'text') el.textContent = value;
    else if (key.startsWith('on')) el.addEventListener(key.slice(2), value);
    else if (key === 'value' || key === 'checked') el[key] = value;
    else el.setAttribute(key, value === true ? '' : value);
  }
  for (const child of children.flat()) {
    if (child === null || child === undefined || child === false) continue;
    el.append(child instanceof Node ? child : document.createTextNode(String(child)));
  }
  return el;
}

export const $ = (sel, root = document) => root.querySelector(sel);

export function clear(el, ...children) {
  el.replaceChildren(...children.flat().filter((c) => c !== null && c !== undefined));
  return el;
}

export const json = (value, indent = 2) => JSON.stringify(value, null, indent);

export function short(value, max = 60) {
  const text = typeof value === 'string' ? value : JSON.stringify(value);
  if (text === undefined) return '';
  return text.length > max ? text.slice(0, max - 1) + '…' : text;
}

export function download(name, text, type = 'application/json') {
  const url = URL.createObjectURL(new Blob([text], { type }));
  const a = h('a', { href: url, download: name });
  document.body.append(a);
  a.click();
  a.remove();
  setTimeout(() => URL.revokeObjectURL(url), 1000);
}

// Deep equality of JSON values (key order ignored).
export function equal(a, b) {
  if (a === b) return true;
  if (typeof a !== typeof b || a === null || b === null || typeof a !== 'object') return false;
  if (Array.isArray(a) !== Array.isArray(b)) return false;
  const ka = Object.keys(a);
  const kb = Object.keys(b);
  return ka.length === kb.length && ka.every((k) => k in b && equal(a[k], b[k]));
}

// The leaf-level differences between two JSON values: [{path, before, after}].
export function diff(before, after, path = [], out = []) {
  if (equal(before, after)) return out;
  const objects = (v) => v !== null && typeof v === 'object';
  if (objects(before) && objects(after) && Array.isArray(before) === Array.isArray(after)) {
    const keys = new Set([...Object.keys(before), ...Object.keys(after)]);
    for (const key of keys) diff(before[key], after[key], [...path, key], out);
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
