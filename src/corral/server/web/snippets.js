// Code the page writes from an episode: "Copy as Python" and "Copy as curl". Every value
// from the episode, the server or the page's URL enters the code as a literal of the
// target language (pyLiteral, shellQuote), never as code: an action, an option or a URL
// path cannot steer what the snippet runs. Pure: no DOM, no globals.

import { plain } from './arrays.js';

const hex4 = (code) => code.toString(16).padStart(4, '0');

// A Python string literal for `text`, in ASCII: every character outside printable ASCII,
// the quote and the backslash escaped (lone surrogates included, as Python writes them).
export function pyString(text) {
  let out = '"';
  for (const ch of text) {
    const code = ch.codePointAt(0);
    if (ch === '"' || ch === '\\') out += `\\${ch}`;
    else if (code >= 0x20 && code < 0x7f) out += ch;
    else if (ch === '\n') out += '\\n';
    else if (ch === '\r') out += '\\r';
    else if (ch === '\t') out += '\\t';
    else if (code <= 0xff) out += `\\x${code.toString(16).padStart(2, '0')}`;
    else if (code <= 0xffff) out += `\\u${hex4(code)}`;
    else out += `\\U${code.toString(16).padStart(8, '0')}`;
  }
  return `${out}"`;
}

// A Python literal for a JSON value: None/True/False, numbers, ASCII strings, lists,
// dicts. Non-finite numbers (which JSON cannot carry but a JS value may) are float(...).
export function pyLiteral(value) {
  if (value === null || value === undefined) return 'None';
  if (value === true) return 'True';
  if (value === false) return 'False';
  if (typeof value === 'number') {
    if (Number.isNaN(value)) return 'float("nan")';
    if (!Number.isFinite(value)) return value > 0 ? 'float("inf")' : '-float("inf")';
    if (Object.is(value, -0)) return '-0.0';
    // Past 2^53 a whole number is a float whose digits JavaScript pads with zeros: as a
    // Python int that would be another number; in exponent form it is the same float.
    return Number.isInteger(value) && !Number.isSafeInteger(value) ? value.toExponential() : String(value);
  }
  if (typeof value === 'bigint') return String(value);
  if (typeof value === 'string') return pyString(value);
  if (Array.isArray(value)) return `[${value.map(pyLiteral).join(', ')}]`;
  if (typeof value === 'object') {
    return `{${Object.entries(value).map(([k, v]) => `${pyString(k)}: ${pyLiteral(v)}`).join(', ')}}`;
  }
  throw new TypeError(`no Python literal for a ${typeof value}`);
}

// A POSIX shell word holding `text` as it is (single quotes; a quote inside becomes '\'').
export const shellQuote = (text) => `'${String(text).replace(/'/g, "'\\''")}'`;

// The actions of steps 1..index (at least the first) of an episode.
const actionsUpTo = (ep, index) => ep.steps.slice(1, Math.max(1, index + 1)).map((s) => s.action);

// Arrays go back as nested lists (what an Array field validates from), never cut.
const full = (value) => plain(value, Infinity);

export function pythonSnippet(ep, index, meta) {
  const options = ep.options && Object.keys(ep.options).length ? `, **${pyLiteral(full(ep.options))}` : '';
  const lines = [
    'import asyncio',
    '',
    'from corral.client import AsyncEnvClient',
    '',
    '',
    'async def main() -> None:',
    '    # token=... (or $CORRAL_TOKEN) if the server requires one',
    `    async with AsyncEnvClient(${pyString(meta.url)}, codec="json") as env:`,
    `        result = await env.reset(seed=${pyLiteral(ep.seed)}${options})`,
    ...actionsUpTo(ep, index).map((a) => `        result = await env.step(${pyLiteral(full(a))})`),
    '        print(result)',
    '        print(await env.state())',
    '',
    '',
    'asyncio.run(main())',
  ];
  return lines.join('\n') + '\n';
}

export function curlSnippet(ep, index, meta) {
  const auth = ' -H "Authorization: Bearer $CORRAL_TOKEN"';
  const type = '-H "Content-Type: application/json"';
  const at = (route) => shellQuote(`${meta.url}/${route}`);
  const reset = { ...full(ep.options || {}) };
  if (ep.seed !== null && ep.seed !== undefined) reset.seed = ep.seed;
  const session = '-H "X-Corral-Session: $S"';
  const lines = [
    '# a stateful HTTP session (POST /sessions); drop the Authorization header if the server has no token',
    `S=$(curl -s -X POST${auth} ${at('sessions')} | python3 -c 'import json,sys; print(json.load(sys.stdin)["session_id"])')`,
    `curl -s -X POST${auth} ${session} ${type} ${at('reset')} -d ${shellQuote(JSON.stringify(reset))}`,
    ...actionsUpTo(ep, index).map((a) => `curl -s -X POST${auth} ${session} ${type} ${at('step')} -d ${shellQuote(JSON.stringify({ action: full(a) }))}`),
    `curl -s${auth} ${session} ${at('state')}`,
    `curl -s -X DELETE${auth} ${shellQuote(`${meta.url}/sessions/`)}"$S"`,
  ];
  return lines.join('\n') + '\n';
}
