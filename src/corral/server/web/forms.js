// Forms generated from JSON Schemas (pydantic's dialect): one widget per schema node.
// A widget is {el, get(), set(value)}; get() returns undefined for an optional field left
// empty (it is then not sent) and throws InputError for input that is not even JSON.
// References are schema.js's (one resolver, with a cycle guard); a model that contains
// itself gets a JSON editor where it recurs, instead of a form without end.
// Over 500 lines as one thing: the widget of every schema kind, which build one another
// recursively (build → object → build ...) on one Form that registers each field for the
// server's error locations.

import { h } from './dom.js';
import { json, equal, mask, unmask, SECRET } from './values.js';
import { deref, refOf, SchemaRefError } from './schema.js';
import { plain } from './arrays.js';

const LONG = /code|text|content|body|prompt|source|program|script|message|answer|query/i;

export class InputError extends Error {
  constructor(path, message) {
    super(message);
    this.path = path;
  }
}

// `schema` with its references followed; a broken reference is a node the form shows as
// a JSON editor with the reason.
export function resolve(schema, root) {
  try {
    return deref(schema, root);
  } catch (e) {
    if (!(e instanceof SchemaRefError)) throw e;
    return { 'x-corral-unreadable': `${e.code}: ${e.message}` };
  }
}

// A top-level free-form `metadata` object (OpenEnv's Action base class has one) is not the
// environment's own field: it goes last, folded.
const isBaseMetadata = (key, s) => key === 'metadata' && s.type === 'object' && !s.properties;

const variantsOf = (s) => s.oneOf || s.anyOf || null;
const isNull = (s) => s.type === 'null';

function describe(s, root) {
  s = resolve(s, root);
  if (s.title) return s.title;
  if (s.const !== undefined) return String(s.const);
  return s.type || 'value';
}

// Does value fit schema s closely enough to pick s among a union's variants? (Unions of
// unions that refer back to themselves stop at a depth no real schema reaches.)
function fits(s, v, root, depth = 0) {
  s = resolve(s, root);
  if (s.const !== undefined) return equal(s.const, v);
  if (s.enum) return s.enum.some((e) => equal(e, v));
  const variants = variantsOf(s);
  if (variants) return depth < 16 && variants.some((x) => fits(x, v, root, depth + 1));
  const t = s.type;
  if (v === null) return t === 'null';
  if (Array.isArray(v)) return t === 'array';
  if (typeof v === 'boolean') return t === 'boolean';
  if (typeof v === 'number') return t === 'number' || (t === 'integer' && Number.isInteger(v));
  if (typeof v === 'string') return t === 'string';
  if (typeof v !== 'object' || (t && t !== 'object')) return false;
  if (s['x-corral-ndarray']) return 'dtype' in v;
  for (const [key, prop] of Object.entries(s.properties || {})) {
    const p = resolve(prop, root);
    if (p.const !== undefined && !equal(v[key], p.const)) return false;
  }
  const known = s.properties ? Object.keys(s.properties) : [];
  return s.additionalProperties !== false || Object.keys(v).every((k) => known.includes(k));
}

export class Form {
  constructor(schema, { id = 'f', onChange = () => {} } = {}) {
    this.root = schema || {};
    this.id = id;
    this.onChange = onChange;
    this.fields = new Map();
    this.widget = this.build(this.root, [], { required: true, top: true });
    this.el = h('div', { class: 'form' }, this.widget.el);
    this.el.addEventListener('input', () => this.onChange());
    this.el.addEventListener('change', () => this.onChange());
  }

  get value() {
    return this.widget.get();
  }

  set value(v) {
    this.widget.set(v);
  }

  key(path) {
    return path.join('\u0000');
  }

  register(path, el) {
    this.fields.set(this.key(path), el);
  }

  // Mark the fields named by pydantic's error locations; returns the paths marked.
  highlight(errors) {
    this.clearErrors();
    const marked = [];
    for (const error of errors || []) {
      const loc = (error.loc || []).filter((seg) => seg !== 'body' && seg !== 'action');
      let path = [];
      for (const seg of loc) {
        if (this.fields.has(this.key([...path, seg]))) path = [...path, seg];
      }
      const el = this.fields.get(this.key(path));
      if (!el) continue;
      el.classList.add('invalid');
      el.append(h('div', { class: 'field-error', role: 'alert', text: error.msg || '' }));
      marked.push(path);
    }
    return marked;
  }

  clearErrors() {
    for (const el of this.el.querySelectorAll('.invalid')) el.classList.remove('invalid');
    for (const el of this.el.querySelectorAll('.field-error')) el.remove();
  }

  // `opts.refs`: the references being expanded on the way here (the cycle guard).
  build(schema, path, opts = {}) {
    const ref = refOf(schema);
    const refs = opts.refs || new Set();
    if (ref !== null && refs.has(ref)) {
      return this.raw({ ...resolve(schema, this.root), type: undefined, 'x-corral-recursive': ref }, path, opts);
    }
    if (ref !== null) opts = { ...opts, refs: new Set([...refs, ref]) };
    const s = resolve(schema, this.root);
    if (s['x-corral-unreadable']) return this.raw(s, path, opts);
    const variants = variantsOf(s);
    if (variants) {
      const real = variants.filter((v) => !isNull(resolve(v, this.root)));
      if (real.length < variants.length) {
        // Optional[X]: X keeps its reference (allOf of one), so the cycle guard sees it.
        const inner = real.length === 1 ? { ...s, allOf: [real[0]] } : { ...s, anyOf: real };
        delete inner.oneOf;
        if (real.length === 1) delete inner.anyOf;
        return this.nullable(inner, path, opts);
      }
      return this.union(s, variants, path, opts);
    }
    // An Enum class (a $ref) is a select; an inline Literal of a few values, radios.
    if (s.enum) return ref === null && s.enum.length <= 6 ? this.radios(s, path, opts) : this.select(s, path, opts);
    if (s.const !== undefined) return this.constant(s, path, opts);
    if (s['x-corral-ndarray']) return this.ndarray(s, path, opts);
    switch (s.type) {
      case 'boolean':
        return this.toggle(s, path, opts);
      case 'integer':
      case 'number':
        return this.number(s, path, opts);
      case 'string':
        return this.text(s, path, opts);
      case 'array':
        return s.items || s.prefixItems ? this.list(s, path, opts) : this.raw(s, path, opts);
      case 'object':
        return s.properties ? this.object(s, path, opts) : this.raw(s, path, opts);
      default:
        return s.properties ? this.object(s, path, opts) : this.raw(s, path, opts);
    }
  }

  inputId(path) {
    return `${this.id}-${path.join('.') || 'value'}`;
  }

  field(s, path, opts, control, extra = []) {
    const name = opts.name ?? path[path.length - 1];
    const label = s.title && name === undefined && !opts.untitled ? s.title : name;
    const el = h(
      'div',
      { class: 'field', 'data-path': path.join('.') },
      label !== undefined
        ? h('label', { for: this.inputId(path), text: String(label) + (opts.required ? ' *' : '') })
        : null,
      control,
      ...extra,
      s.description ? h('div', { class: 'hint', text: s.description }) : null,
    );
    this.register(path, el);
    return el;
  }

  text(s, path, opts) {
    const name = String(path[path.length - 1] ?? '');
    const secret = s.format === 'password' || s.writeOnly || SECRET.test(name);
    const long = !secret && !s.pattern && ((s.maxLength ?? 0) > 200 || (s.maxLength === undefined && LONG.test(name)));
    const attrs = {
      id: this.inputId(path),
      name: path.join('.'),
      placeholder: s.examples ? String(s.examples[0]) : '',
      autocomplete: 'off',
      spellcheck: 'false',
    };
    const input = long
      ? h('textarea', { ...attrs, rows: 3 })
      : h('input', { ...attrs, type: secret ? 'password' : 'text', pattern: s.pattern });
    const extra = [];
    if (secret) {
      extra.push(
        h('button', {
          type: 'button',
          class: 'small',
          'aria-label': `show ${name}`,
          text: 'show',
          onclick: (e) => {
            input.type = input.type === 'password' ? 'text' : 'password';
            e.target.textContent = input.type === 'password' ? 'show' : 'hide';
          },
        }),
      );
    }
    const fallback = s.default !== undefined ? s.default : '';
    const w = {
      el: this.field(s, path, opts, input, extra),
      get: () => (input.value === '' && !opts.required && s.default === undefined ? undefined : input.value),
      set: (v) => {
        input.value = v === undefined || v === null ? fallback : String(v);
      },
    };
    w.set(undefined);
    return w;
  }

  number(s, path, opts) {
    const min = s.minimum ?? (s.exclusiveMinimum !== undefined ? s.exclusiveMinimum : undefined);
    const max = s.maximum ?? (s.exclusiveMaximum !== undefined ? s.exclusiveMaximum : undefined);
    const step = s.type === 'integer' ? 1 : s.multipleOf || 'any';
    const input = h('input', { id: this.inputId(path), type: 'number', min, max, step });
    const bounded = min !== undefined && max !== undefined && max - min <= 10000;
    const slider = bounded
      ? h('input', {
          type: 'range',
          min,
          max,
          step: step === 'any' ? (max - min) / 100 : step,
          'aria-label': `${path[path.length - 1] ?? 'value'} slider`,
          oninput: () => {
            input.value = slider.value;
            sync();
          },
        })
      : null;
    // An empty input (no value, no default) is not a value at either end of the slider:
    // the slider rests at the minimum, dimmed, and says it is not set.
    const sync = () => {
      if (!slider) return;
      const empty = input.value === '';
      slider.value = empty ? String(min) : input.value;
      slider.classList.toggle('unset', empty);
      slider.setAttribute('aria-valuetext', empty ? 'not set' : input.value);
    };
    input.addEventListener('input', sync);
    const w = {
      el: this.field(s, path, opts, h('div', { class: 'row' }, input, slider)),
      get: () => (input.value === '' ? undefined : Number(input.value)),
      set: (v) => {
        const value = v === undefined || v === null ? s.default : v;
        input.value = value === undefined || value === null ? '' : String(value);
        sync();
      },
    };
    w.set(undefined);
    return w;
  }

  toggle(s, path, opts) {
    const input = h('input', { id: this.inputId(path), type: 'checkbox', role: 'switch' });
    const w = {
      el: this.field(s, path, opts, input),
      get: () => input.checked,
      set: (v) => {
        input.checked = Boolean(v === undefined || v === null ? s.default : v);
      },
    };
    w.set(undefined);
    return w;
  }

  select(s, path, opts) {
    const input = h(
      'select',
      { id: this.inputId(path) },
      opts.required || s.default !== undefined ? null : h('option', { value: '', text: '—' }),
      s.enum.map((value, i) => h('option', { value: String(i), text: String(value) })),
    );
    const w = {
      el: this.field(s, path, opts, input),
      get: () => (input.value === '' ? undefined : s.enum[Number(input.value)]),
      set: (v) => {
        const index = s.enum.findIndex((e) => equal(e, v === undefined ? s.default : v));
        input.value = index >= 0 ? String(index) : input.options[0]?.value ?? '';
      },
    };
    w.set(undefined);
    return w;
  }

  radios(s, path, opts) {
    const name = this.inputId(path);
    const buttons = s.enum.map((value, i) => h('input', { type: 'radio', name, value: String(i), id: `${name}-${i}` }));
    const group = h(
      'div',
      { class: 'tabs', role: 'radiogroup', id: name, 'aria-label': String(path[path.length - 1] ?? 'value') },
      buttons.map((b, i) => h('label', { class: 'tab', for: b.id }, b, String(s.enum[i]))),
    );
    const w = {
      el: this.field(s, path, opts, group),
      get: () => {
        const i = buttons.findIndex((b) => b.checked);
        return i < 0 ? undefined : s.enum[i];
      },
      set: (v) => {
        const index = s.enum.findIndex((e) => equal(e, v === undefined ? s.default : v));
        buttons.forEach((b, i) => (b.checked = i === index));
      },
    };
    w.set(undefined);
    return w;
  }

  constant(s, path, opts) {
    const shown = h('output', { id: this.inputId(path), class: 'const', text: json(s.const, 0) });
    return { el: this.field(s, path, opts, shown), get: () => s.const, set: () => {} };
  }

  raw(s, path, opts) {
    const why = s['x-corral-recursive']
      ? `JSON: ${s['x-corral-recursive'].split('/').pop()} contains itself`
      : s['x-corral-unreadable']
        ? `JSON: the schema cannot be read (${s['x-corral-unreadable']})`
        : 'JSON';
    const input = h('textarea', {
      id: this.inputId(path),
      class: 'json',
      rows: 2,
      placeholder: s.type === 'array' ? '[ ]' : s.type === 'object' ? '{ }' : 'JSON',
      spellcheck: 'false',
    });
    const w = {
      el: this.field(s, path, opts, input, [h('span', { class: 'badge', text: why })]),
      get: () => {
        if (input.value.trim() === '') return undefined;
        try {
          return JSON.parse(input.value);
        } catch (e) {
          throw new InputError(path, `not JSON: ${e.message}`);
        }
      },
      set: (v) => {
        const value = v === undefined ? s.default : v;
        input.value = value === undefined ? '' : json(value, 0);
      },
    };
    w.set(undefined);
    return w;
  }

  ndarray(s, path, opts) {
    const spec = s['x-corral-ndarray'];
    const badge = `${spec.dtype ?? 'any dtype'} · ${spec.shape ? '(' + spec.shape.map((d) => d ?? '*').join('×') + ')' : 'any shape'}`;
    const w = this.raw({ ...s, type: 'array', default: undefined }, path, opts);
    w.el.querySelector('.badge').textContent = `array ${badge}`;
    w.el.querySelector('textarea').placeholder = 'nested lists, e.g. [[0, 1], [2, 3]]';
    // Shown and edited as numbers: a {dtype, shape, data} value (a default, a replayed
    // action) becomes nested lists, which the field validates from just the same.
    const set = w.set;
    w.set = (v) => set(plain(v === undefined ? s.default : v, Infinity));
    w.set(undefined);
    return w;
  }

  object(s, path, opts) {
    const required = new Set(s.required || []);
    const entries = Object.entries(s.properties);
    const base = opts.top ? entries.filter(([key, prop]) => isBaseMetadata(key, resolve(prop, this.root))) : [];
    const own = entries.filter((entry) => !base.includes(entry));
    const children = [...own, ...base].map(([key, prop]) => [
      key,
      this.build(prop, [...path, key], { required: required.has(key), name: key, refs: opts.refs }),
    ]);
    const body = children.map(([key, w]) =>
      base.some(([k]) => k === key) ? h('details', { class: 'base-field' }, h('summary', { text: `${key} (from the base class)` }), w.el) : w.el,
    );
    const el = opts.top
      ? h('div', { class: 'fields' }, body)
      : h('fieldset', { 'data-path': path.join('.') }, h('legend', { text: opts.untitled ? '' : opts.name ?? s.title ?? '' }), body);
    if (!opts.top) this.register(path, el);
    return {
      el,
      get: () => {
        const out = {};
        for (const [key, w] of children) {
          const v = w.get();
          if (v !== undefined) out[key] = v;
        }
        return out;
      },
      set: (v) => {
        for (const [key, w] of children) w.set(v && typeof v === 'object' ? v[key] : undefined);
      },
    };
  }

  list(s, path, opts) {
    const rows = [];
    const box = h('div', { class: 'rows' });
    const fixed = Array.isArray(s.prefixItems);
    const add = (value) => {
      const index = rows.length;
      const itemSchema = fixed ? s.prefixItems[index] : s.items;
      const w = this.build(itemSchema, [...path, index], { required: true, name: `#${index}`, refs: opts.refs });
      const row = h('div', { class: 'list-row' }, w.el);
      if (!fixed) {
        row.append(
          h('button', {
            type: 'button',
            class: 'small',
            'aria-label': `remove item ${index}`,
            text: '−',
            onclick: () => {
              const values = get();
              values.splice(rows.indexOf(entry), 1);
              set(values);
              this.onChange();
            },
          }),
        );
      }
      const entry = { w, row };
      rows.push(entry);
      box.append(row);
      if (value !== undefined) w.set(value);
    };
    const get = () => rows.map(({ w }) => w.get());
    const set = (values) => {
      rows.length = 0;
      box.replaceChildren();
      const list = Array.isArray(values) ? values : fixed ? s.prefixItems.map(() => undefined) : s.default || [];
      list.forEach((v) => add(v));
    };
    const addButton = fixed
      ? null
      : h('button', {
          type: 'button',
          class: 'small',
          'aria-label': `add item to ${path.join('.') || 'list'}`,
          text: '+ add',
          onclick: () => {
            add(undefined);
            this.onChange();
          },
        });
    const el = h(
      'fieldset',
      { class: 'list', 'data-path': path.join('.') },
      h('legend', { text: `${opts.name ?? s.title ?? 'items'} [${describe(s.items || {}, this.root)}]` }),
      box,
      addButton,
    );
    this.register(path, el);
    set(undefined);
    return {
      el,
      get: () => {
        const values = get();
        return values.length === 0 && !opts.required && s.default === undefined ? undefined : values;
      },
      set,
    };
  }

  nullable(s, path, opts) {
    const inner = this.build(s, path, opts);
    const id = `${this.inputId(path)}-null`;
    const isSet = h('input', { type: 'checkbox', id, 'aria-label': `set ${path.join('.') || 'value'}` });
    const sync = () => inner.el.classList.toggle('unset', !isSet.checked);
    isSet.addEventListener('change', sync);
    const el = h('div', { class: 'nullable' }, h('label', { class: 'null-toggle', for: id, title: 'send a value (else null)' }, isSet, 'set'), inner.el);
    const w = {
      el,
      get: () => (isSet.checked ? inner.get() : opts.required ? null : s.default === undefined ? undefined : null),
      set: (v) => {
        const value = v === undefined ? s.default : v;
        isSet.checked = value !== undefined && value !== null;
        if (isSet.checked) inner.set(value);
        sync();
      },
    };
    w.set(undefined);
    return w;
  }

  union(s, variants, path, opts) {
    const name = `${this.inputId(path)}-variant`;
    const branches = variants.map((v, i) => ({
      schema: v,
      w: this.build(v, path, { ...opts, name: undefined, untitled: true }),
      radio: h('input', { type: 'radio', name, value: String(i), id: `${name}-${i}` }),
    }));
    let active = 0;
    const show = (i) => {
      active = i;
      branches.forEach((b, j) => {
        b.radio.checked = j === i;
        b.w.el.hidden = j !== i;
      });
    };
    const tabs = h(
      'div',
      { class: 'tabs', role: 'radiogroup', 'aria-label': `${opts.name ?? path.join('.') ?? 'value'} variant` },
      branches.map((b) =>
        h('label', { class: 'tab', for: b.radio.id }, b.radio, describe(b.schema, this.root)),
      ),
    );
    tabs.addEventListener('change', (e) => show(Number(e.target.value)));
    const el = h(
      'fieldset',
      { class: 'union', 'data-path': path.join('.') },
      h('legend', { text: opts.name ?? s.title ?? 'one of' }),
      tabs,
      branches.map((b) => b.w.el),
    );
    this.register(path, el);
    show(0);
    return {
      el,
      get: () => branches[active].w.get(),
      set: (v) => {
        const value = v === undefined ? s.default : v;
        const i = value === undefined ? 0 : Math.max(0, branches.findIndex((b) => fits(b.schema, value, this.root)));
        show(i);
        branches[i].w.set(value);
      },
    };
  }
}

// A form plus a raw-JSON editor kept in sync with it, both ways.
export class FormWithJson {
  constructor(schema, { id, label }) {
    this.rawError = h('div', { class: 'hint warn', role: 'status' });
    this.raw = h('textarea', {
      id: `${id}-raw`,
      class: 'json raw',
      rows: 6,
      spellcheck: 'false',
      'aria-label': `${label} as JSON`,
    });
    this.form = new Form(schema, { id, onChange: () => this.formChanged() });
    this.raw.addEventListener('input', () => this.rawChanged());
    this.el = h(
      'div',
      { class: 'form-json' },
      this.form.el,
      h('details', { class: 'raw-json' }, h('summary', { text: 'JSON' }), this.raw, this.rawError),
    );
    this.formChanged();
  }

  formChanged() {
    this.fromRaw = false;
    try {
      this.raw.value = json(mask(this.form.value));
      this.rawError.textContent = '';
    } catch (e) {
      this.rawError.textContent = e.message;
    }
  }

  // What was typed in the JSON editor is sent as typed (extra or mistyped fields included,
  // to see how the server answers them); the form shows what it can of it.
  rawChanged() {
    try {
      this.form.value = this.parseRaw();
      this.fromRaw = true;
      this.rawError.textContent = '';
    } catch (e) {
      this.rawError.textContent = `not JSON yet: ${e.message}`;
    }
  }

  // The editor shows secrets masked; a mask left as it was stands for the real value.
  parseRaw() {
    return unmask(JSON.parse(this.raw.value), this.form.value);
  }

  get value() {
    if (this.fromRaw) {
      try {
        return this.parseRaw();
      } catch (e) {
        throw new InputError([], `the JSON editor holds invalid JSON: ${e.message}`);
      }
    }
    return this.form.value;
  }

  set value(v) {
    this.form.value = v;
    this.formChanged();
  }
}
