// Arrays as people read them: numbers, not base64. An array crosses the JSON codec as
// {dtype, shape, data} (numpy's dtype string, the shape, base64 of the C-order bytes; see
// corral.contract.arrays); this module decodes that, lays it out as a list, a grid or an
// image, and cuts what is too big to show, saying so. Pure: no DOM, no globals.

export const CAP = 1000;
// Values shown as text at most (lists, nested lists, diffs).
export const GRID = { rows: 32, cols: 32 };
// The largest grid drawn as a table; a bigger 2-D array is cut to this corner.
export const MAX_PIXELS = 4096 * 4096;
// Images larger than this are not drawn (the numbers still are, cut).

const DTYPE = /^([<>|=]?)([biufc])(\d+)$/;
const SIZES = { b: [1], i: [1, 2, 4, 8], u: [1, 2, 4, 8], f: [2, 4, 8], c: [8, 16] };

// The dtype string parsed, or null for one this page does not decode.
export function parseDtype(dtype) {
  const m = DTYPE.exec(typeof dtype === 'string' ? dtype : '');
  if (!m) return null;
  const [, order, kind, digits] = m;
  const size = Number(digits);
  if (!SIZES[kind].includes(size)) return null;
  // '|' (no order) is for single bytes; '=' is the sender's native order, which numpy
  // writes as '<' or '>' on the wire anyway: read it as little-endian, as every host is.
  return { kind, size, little: order !== '>' };
}

export function isArrayValue(v) {
  return (
    v !== null &&
    typeof v === 'object' &&
    !Array.isArray(v) &&
    typeof v.dtype === 'string' &&
    typeof v.data === 'string' &&
    Array.isArray(v.shape) &&
    v.shape.every((n) => Number.isInteger(n) && n >= 0)
  );
}

export const countOf = (shape) => shape.reduce((a, b) => a * b, 1);

function half(bits) {
  const sign = bits & 0x8000 ? -1 : 1;
  const exponent = (bits >> 10) & 0x1f;
  const fraction = bits & 0x3ff;
  if (exponent === 0) return sign * 2 ** -14 * (fraction / 1024);
  if (exponent === 0x1f) return fraction ? NaN : sign * Infinity;
  return sign * 2 ** (exponent - 15) * (1 + fraction / 1024);
}

// The nearest float16 to x (round to 11 significant bits; subnormals below 2^-14).
function toHalf(x) {
  if (!Number.isFinite(x) || x === 0) return x;
  const a = Math.abs(x);
  const exponent = Math.max(Math.floor(Math.log2(a)), -14);
  const quantum = 2 ** (exponent - 10);
  const r = Math.round(a / quantum) * quantum;
  return Math.sign(x) * (r > 65504 ? Infinity : r);
}

// The shortest decimal that reads back as the same value of the narrower float (what
// numpy prints): float32's 0.1 shows as 0.1, not 0.10000000149011612, and two values that
// differ still show differently.
function shortest(x, narrow) {
  if (!Number.isFinite(x) || x === 0) return x;
  for (let p = 1; p < 17; p++) {
    const candidate = Number(x.toPrecision(p));
    if (narrow(candidate) === x) return candidate;
  }
  return x;
}

function big(value) {
  return value >= BigInt(Number.MIN_SAFE_INTEGER) && value <= BigInt(Number.MAX_SAFE_INTEGER) ? Number(value) : String(value);
}

// A function reading element i of a DataView for the parsed dtype. Floats are their
// shortest decimal (above); 64-bit integers beyond 2^53 come back as strings so that no
// digit is wrong; complex values are "re+imj" strings as Python writes them.
function reader({ kind, size, little }) {
  const at = (view, i) => i * size;
  switch (`${kind}${size}`) {
    case 'b1': return (view, i) => view.getUint8(i) !== 0;
    case 'i1': return (view, i) => view.getInt8(i);
    case 'u1': return (view, i) => view.getUint8(i);
    case 'i2': return (view, i) => view.getInt16(at(view, i), little);
    case 'u2': return (view, i) => view.getUint16(at(view, i), little);
    case 'i4': return (view, i) => view.getInt32(at(view, i), little);
    case 'u4': return (view, i) => view.getUint32(at(view, i), little);
    case 'i8': return (view, i) => big(view.getBigInt64(at(view, i), little));
    case 'u8': return (view, i) => big(view.getBigUint64(at(view, i), little));
    case 'f2': return (view, i) => shortest(half(view.getUint16(at(view, i), little)), toHalf);
    case 'f4': return (view, i) => shortest(view.getFloat32(at(view, i), little), Math.fround);
    case 'f8': return (view, i) => view.getFloat64(at(view, i), little);
    case 'c8':
    case 'c16': {
      const part = size / 2;
      const get = (view, o) => (part === 4 ? shortest(view.getFloat32(o, little), Math.fround) : view.getFloat64(o, little));
      return (view, i) => {
        const re = get(view, i * size);
        const im = get(view, i * size + part);
        return `${re}${im < 0 || Object.is(im, -0) ? '-' : '+'}${Math.abs(im)}j`;
      };
    }
    default: return null;
  }
}

// The first `bytes` bytes of base64 `text`, decoding no more of it than needed.
export function base64Bytes(text, bytes = Infinity) {
  const chars = Number.isFinite(bytes) ? Math.ceil(bytes / 3) * 4 : text.length;
  const raw = atob(text.slice(0, chars));
  const n = Math.min(raw.length, bytes);
  const out = new Uint8Array(n);
  for (let i = 0; i < n; i++) out[i] = raw.charCodeAt(i);
  return out;
}

const byteLength = (text) => {
  const pad = text.endsWith('==') ? 2 : text.endsWith('=') ? 1 : 0;
  return (text.length / 4) * 3 - pad;
};

// {dtype, shape, count, values (the first `limit` in C order), cut} or {error} for a
// value that claims to be an array and is not a readable one.
export function decodeArray(value, limit = CAP) {
  if (!isArrayValue(value)) return { error: 'not an array value' };
  const spec = parseDtype(value.dtype);
  const count = countOf(value.shape);
  if (!spec) return { dtype: value.dtype, shape: value.shape, count, error: `dtype ${value.dtype} is not shown as numbers` };
  const need = count * spec.size;
  if (value.data.length % 4 !== 0 || byteLength(value.data) !== need) {
    return { dtype: value.dtype, shape: value.shape, count, error: `the data is not ${need} bytes of base64` };
  }
  const shown = Math.min(count, limit);
  let bytes;
  try {
    bytes = base64Bytes(value.data, shown * spec.size);
  } catch {
    return { dtype: value.dtype, shape: value.shape, count, error: 'the data is not base64' };
  }
  const view = new DataView(bytes.buffer);
  const read = reader(spec);
  const values = new Array(shown);
  for (let i = 0; i < shown; i++) values[i] = read(view, i);
  return { dtype: value.dtype, shape: value.shape, count, values, cut: shown < count };
}

// How an array is best shown: 'scalar', 'list' (1-D), 'grid' (2-D), 'image' (H×W×1/3/4
// uint8) or 'nested' (anything else).
export function layoutOf(value) {
  const { shape } = value;
  if (shape.length === 0) return 'scalar';
  if (shape.length === 1) return 'list';
  if (shape.length === 2) return 'grid';
  const spec = parseDtype(value.dtype);
  const uint8 = spec && spec.kind === 'u' && spec.size === 1;
  if (shape.length === 3 && uint8 && [1, 3, 4].includes(shape[2])) return 'image';
  return 'nested';
}

// Flat C-order values back into nested lists of `shape`, as many leading rows as `values`
// holds in full (with `limit` values at most). Returns {nested, rows, of} where `rows` of
// `of` leading rows are shown; a first row too large for the limit is cut inside.
export function nest(values, shape, limit = CAP) {
  if (shape.length === 0) return { nested: values[0], rows: 1, of: 1 };
  const row = countOf(shape.slice(1));
  const of = shape[0];
  const build = (flat, dims) => {
    if (dims.length === 1) return flat.slice(0, dims[0]);
    const inner = countOf(dims.slice(1));
    const out = [];
    for (let r = 0; r < dims[0]; r++) out.push(build(flat.slice(r * inner, (r + 1) * inner), dims.slice(1)));
    return out;
  };
  const available = Math.min(values.length, limit);
  if (row === 0) return { nested: build([], shape), rows: of, of };
  const rows = Math.min(of, Math.floor(available / row));
  if (rows === 0 && of > 0) {
    // One row alone is over the limit: show its first values, flat.
    return { nested: [values.slice(0, available)], rows: 0, of, partial: true };
  }
  return { nested: build(values.slice(0, rows * row), [rows, ...shape.slice(1)]), rows, of };
}

// The top-left corner of a 2-D array for a table: {cells: rows of values, rows, cols,
// ofRows, ofCols, cut}.
export function gridOf(value, cap = GRID) {
  const [height, width] = value.shape;
  const rows = Math.min(height, cap.rows);
  const cols = Math.min(width, cap.cols);
  // Decode up to the last shown row only; rows are then cut to the shown columns.
  const decoded = decodeArray(value, rows * width);
  if (decoded.error) return decoded;
  const cells = [];
  for (let r = 0; r < rows; r++) cells.push(decoded.values.slice(r * width, r * width + cols));
  return { cells, rows, cols, ofRows: height, ofCols: width, cut: rows < height || cols < width };
}

// RGBA pixels of an image-like uint8 array (H×W, H×W×1, H×W×3, H×W×4), or {error}.
export function pixelsOf(value, maxPixels = MAX_PIXELS) {
  const spec = parseDtype(value.dtype);
  const [height, width, channels = 1] = value.shape;
  if (!spec || spec.kind !== 'u' || spec.size !== 1 || value.shape.length < 2 || value.shape.length > 3 || ![1, 3, 4].includes(channels)) {
    return { error: 'not an image (uint8, H×W or H×W×1/3/4)' };
  }
  if (!height || !width) return { error: 'an empty image' };
  if (height * width > maxPixels) return { error: `${width}×${height} is too large to draw here (over ${maxPixels} pixels)` };
  const need = height * width * channels;
  if (byteLength(value.data) !== need) return { error: `the data is not ${need} bytes` };
  const data = base64Bytes(value.data);
  const rgba = new Uint8ClampedArray(width * height * 4);
  for (let p = 0; p < width * height; p++) {
    const o = p * 4;
    const i = p * channels;
    rgba[o] = data[i];
    rgba[o + 1] = channels >= 3 ? data[i + 1] : data[i];
    rgba[o + 2] = channels >= 3 ? data[i + 2] : data[i];
    rgba[o + 3] = channels === 4 ? data[i + 3] : 255;
  }
  return { width, height, channels, rgba };
}

// "(3×3) int8" style description.
export function describeArray(value) {
  return `${value.dtype} (${value.shape.join('×') || 'scalar'})`;
}

const more = (n) => `… ${n.toLocaleString('en-US')} more`;

// `value` with every array inside it replaced by its numbers (nested lists), cut to
// `limit` values each; a cut list ends with a "… N more" string. For JSON shown as text:
// the step detail, diffs, the timeline, snippets.
export function plain(value, limit = CAP) {
  if (isArrayValue(value)) {
    const decoded = decodeArray(value, limit);
    if (decoded.error) return `<array ${describeArray(value)}: ${decoded.error}>`;
    const { nested, rows, partial } = nest(decoded.values, value.shape, limit);
    if (!decoded.cut) return nested;
    const shown = partial ? decoded.values.length : rows * countOf(value.shape.slice(1));
    return [...(partial ? nested[0] : nested), more(decoded.count - shown)];
  }
  if (Array.isArray(value)) return value.map((v) => plain(v, limit));
  if (value !== null && typeof value === 'object') {
    return Object.fromEntries(Object.entries(value).map(([k, v]) => [k, plain(v, limit)]));
  }
  return value;
}

// The multi-index of flat position i in `shape` (C order).
export function unravel(i, shape) {
  const index = new Array(shape.length);
  for (let d = shape.length - 1; d >= 0; d--) {
    index[d] = shape[d] ? i % shape[d] : 0;
    i = shape[d] ? Math.floor(i / shape[d]) : 0;
  }
  return index;
}

// Nested lists as text, one innermost list per line:
//   [[[0,1,2],[3,4,5]],
//    [[6,7,8],[9,10,11]]]
export function nestedText(value, depth = 0) {
  if (!Array.isArray(value)) return JSON.stringify(value);
  if (!value.some(Array.isArray)) return `[${value.map((v) => JSON.stringify(v)).join(',')}]`;
  const pad = ' '.repeat(depth + 1);
  const sep = value.every(Array.isArray) && value.some((v) => v.some(Array.isArray)) ? `,\n\n${pad}` : `,\n${pad}`;
  return `[${value.map((v) => nestedText(v, depth + 1)).join(sep)}]`;
}
