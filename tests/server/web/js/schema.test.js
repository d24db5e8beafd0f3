// The forms' one $ref resolver, against tests/server/web/schema_ref_vectors.json
// ([{name, schema, expect}]: expect is the node deref(schema, schema) gives, or
// {error: CODE}).

import { test } from 'node:test';
import assert from 'node:assert/strict';
import { readFileSync } from 'node:fs';
import { deref, refOf, SchemaRefError } from '../../../../src/corral/server/web/schema.js';

const VECTORS = JSON.parse(readFileSync(new URL('../schema_ref_vectors.json', import.meta.url), 'utf8'));

for (const { name, schema, expect } of VECTORS) {
  test(name, () => {
    if (expect.error) {
      assert.throws(() => deref(schema, schema), (e) => e instanceof SchemaRefError && e.code === expect.error);
    } else {
      assert.deepEqual(deref(schema, schema), expect);
    }
  });
}

test('the issue\'s cycle is an error with a code, not a stack overflow', () => {
  const schema = { $defs: { A: { $ref: '#/$defs/B' }, B: { $ref: '#/$defs/A' } }, $ref: '#/$defs/A' };
  assert.throws(() => deref(schema, schema), /references loop: #\/\$defs\/A → #\/\$defs\/B → #\/\$defs\/A/);
});

test('deref leaves its input alone and refOf names the reference', () => {
  const schema = { $defs: { A: { type: 'integer', title: 'A' } }, properties: { a: { $ref: '#/$defs/A', description: 'x' } } };
  const before = JSON.stringify(schema);
  assert.deepEqual(deref(schema.properties.a, schema), { type: 'integer', title: 'A', description: 'x' });
  assert.equal(JSON.stringify(schema), before);
  assert.equal(refOf(schema.properties.a), '#/$defs/A');
  assert.equal(refOf({ allOf: [{ $ref: '#/$defs/A' }] }), '#/$defs/A');
  assert.equal(refOf({ allOf: [{ $ref: '#/$defs/A' }, { type: 'object' }] }), null);
  assert.deepEqual(deref(undefined, {}), {});
});
