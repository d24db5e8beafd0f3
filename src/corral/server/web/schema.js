// JSON Schema references, resolved by one rule with a cycle guard (the forms' only reader
// of `$ref`). Pure: no DOM, no globals.
//
// deref(node, root) follows `$ref` (a JSON Pointer into `root`: "#/$defs/Point",
// "#/definitions/A", "#/properties/x/items", with ~0 ~1 and %-escapes) until it reaches a
// node without one. The keywords beside a `$ref` apply too (JSON Schema 2020-12): they are
// laid over the target, the nearer one winning; `$defs`/`definitions` beside it are
// containers, not constraints, and are not copied. `allOf` of a single schema (pydantic's
// older way to put a description beside a reference) is read the same way. A chain that
// comes back to a reference it already followed is a cycle: SchemaRefError REF_CYCLE. A
// pointer to nothing is REF_UNRESOLVED; a reference to another document, REF_EXTERNAL.
//
// deref() resolves a chain of references, never a whole tree: a recursive model (a tree
// whose children are trees) is finite at each node. Whoever walks a tree (the form
// builder) keeps the references it is inside (refOf) and stops at one it meets again.

export class SchemaRefError extends Error {
  constructor(code, ref, message) {
    super(message);
    this.code = code;
    this.ref = ref;
  }
}

const CONTAINERS = new Set(['$ref', '$defs', 'definitions']);

const isObject = (v) => v !== null && typeof v === 'object' && !Array.isArray(v);

// The node `ref` points at in `root`.
export function pointer(root, ref) {
  if (typeof ref !== 'string' || !ref.startsWith('#')) {
    throw new SchemaRefError('REF_EXTERNAL', ref, `reference ${JSON.stringify(ref)} is not inside this schema`);
  }
  if (ref.length > 1 && !ref.startsWith('#/')) {
    throw new SchemaRefError('REF_UNRESOLVED', ref, `reference ${JSON.stringify(ref)} is not a JSON Pointer`);
  }
  let node = root;
  const tokens = ref === '#' ? [] : ref.slice(2).split('/');
  for (const raw of tokens) {
    let token;
    try {
      token = decodeURIComponent(raw).replace(/~1/g, '/').replace(/~0/g, '~');
    } catch {
      token = raw;
    }
    const next = isObject(node) || Array.isArray(node) ? node[token] : undefined;
    if (next === undefined || !Object.hasOwn(node, token)) {
      throw new SchemaRefError('REF_UNRESOLVED', ref, `reference ${JSON.stringify(ref)} points at nothing`);
    }
    node = next;
  }
  if (!isObject(node) && typeof node !== 'boolean') {
    throw new SchemaRefError('REF_UNRESOLVED', ref, `reference ${JSON.stringify(ref)} is not a schema`);
  }
  return node === true ? {} : node === false ? { not: {} } : node;
}

// The reference a node stands for: its `$ref`, or that of a single-schema `allOf`.
export function refOf(node) {
  if (!isObject(node)) return null;
  if (typeof node.$ref === 'string') return node.$ref;
  if (Array.isArray(node.allOf) && node.allOf.length === 1 && isObject(node.allOf[0]) && typeof node.allOf[0].$ref === 'string') {
    return node.allOf[0].$ref;
  }
  return null;
}

const siblings = (node) => Object.fromEntries(Object.entries(node).filter(([k]) => !CONTAINERS.has(k) && k !== 'allOf'));

// `node` with its reference chain followed (see the module comment).
export function deref(node, root) {
  if (node === true || node === undefined || node === null) return {};
  if (!isObject(node)) return node === false ? { not: {} } : {};
  const seen = [];
  const layers = [];
  let current = node;
  for (let ref = refOf(current); ref !== null; ref = refOf(current)) {
    if (seen.includes(ref)) {
      throw new SchemaRefError('REF_CYCLE', ref, `references loop: ${[...seen, ref].join(' → ')}`);
    }
    seen.push(ref);
    // The keywords beside the reference (and beside a single allOf) stay on top.
    layers.push(typeof current.$ref === 'string' ? siblings(current) : { ...siblings(current), ...siblings(current.allOf[0]) });
    current = pointer(root, ref);
  }
  if (!seen.length) return node;
  let out = siblings(current);
  if (Array.isArray(current.allOf)) out.allOf = current.allOf;
  for (let i = layers.length - 1; i >= 0; i--) out = { ...out, ...layers[i] };
  return out;
}
