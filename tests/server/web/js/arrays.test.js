// Arrays as numbers: every dtype corral sends, checked against vectors that
// tests/server/web/test_array_vectors.py checks against numpy.

import { test } from 'node:test';
import assert from 'node:assert/strict';
import { readFileSync } from 'node:fs';
import {
  decodeArray, layoutOf, nest, gridOf, pixelsOf, plain, isArrayValue, parseDtype, unravel, describeArray, nestedText,
} from '../../../../src/corral/server/web/arrays.js';

const VECTORS = JSON.parse(readFileSync(new URL('../array_vectors.json', import.meta.url), 'utf8'));

for (const vector of VECTORS) {
  test(`decodes ${vector.name}`, () => {
    const decoded = decodeArray(vector.value, 10_000);
    assert.equal(decoded.error, undefined);
    assert.deepEqual(decoded.values, vector.values);
    assert.equal(decoded.cut, false);
    assert.equal(layoutOf(vector.value), vector.layout);
  });
}

const board = VECTORS[0].value; // |i1 (9) AP8B/wEBAf8A

test('the issue\'s board reads as numbers, not base64', () => {
  assert.deepEqual(plain(board), [0, -1, 1, -1, 1, 1, 1, -1, 0]);
  assert.deepEqual(plain({ board, nested: [{ board }] }), { board: [0, -1, 1, -1, 1, 1, 1, -1, 0], nested: [{ board: [0, -1, 1, -1, 1, 1, 1, -1, 0] }] });
  assert.equal(describeArray(board), '|i1 (9)');
});

test('a large array is cut, and says so', () => {
  const big = { dtype: '|u1', shape: [2000], data: Buffer.alloc(2000, 7).toString('base64') };
  const decoded = decodeArray(big, 100);
  assert.equal(decoded.values.length, 100);
  assert.equal(decoded.count, 2000);
  assert.equal(decoded.cut, true);
  const text = plain(big, 100);
  assert.equal(text.length, 101);
  assert.equal(text.at(-1), '… 1,900 more');
});

test('a cut n-d array keeps whole leading rows', () => {
  const cube = { dtype: '|u1', shape: [10, 4, 5], data: Buffer.alloc(200, 1).toString('base64') };
  const text = plain(cube, 50);
  assert.equal(text.length, 3); // two 4x5 rows of 20, then the note
  assert.deepEqual(text[0], Array(4).fill(Array(5).fill(1)));
  assert.equal(text[2], '… 160 more');
  // A single row over the limit: its first values, flat.
  const wide = { dtype: '|u1', shape: [1, 300], data: Buffer.alloc(300, 2).toString('base64') };
  const cut = plain(wide, 10);
  assert.equal(cut.length, 11);
  assert.equal(cut.at(-1), '… 290 more');
  assert.deepEqual(nest([1, 2, 3, 4, 5, 6], [2, 3]).nested, [[1, 2, 3], [4, 5, 6]]);
});

test('a grid is cut to its top-left corner', () => {
  const plane = { dtype: '|u1', shape: [40, 50], data: Buffer.from(Array.from({ length: 2000 }, (_, i) => i % 256)).toString('base64') };
  const grid = gridOf(plane, { rows: 3, cols: 4 });
  assert.deepEqual(grid.cells, [[0, 1, 2, 3], [50, 51, 52, 53], [100, 101, 102, 103]]);
  assert.deepEqual([grid.rows, grid.cols, grid.ofRows, grid.ofCols, grid.cut], [3, 4, 40, 50, true]);
});

test('images become RGBA pixels; what cannot be drawn says why', () => {
  const rgb = VECTORS.find((v) => v.layout === 'image').value;
  const { width, height, rgba } = pixelsOf(rgb);
  assert.deepEqual([width, height], [2, 2]);
  assert.deepEqual([...rgba.slice(0, 8)], [0, 1, 2, 255, 3, 4, 5, 255]);
  const gray = { dtype: '|u1', shape: [1, 2], data: Buffer.from([9, 200]).toString('base64') };
  assert.deepEqual([...pixelsOf(gray).rgba], [9, 9, 9, 255, 200, 200, 200, 255]);
  assert.match(pixelsOf(board).error, /not an image/);
  assert.match(pixelsOf({ dtype: '|u1', shape: [5000, 5000], data: '' }).error, /too large/);
});

test('bad array values are said to be bad, never thrown', () => {
  assert.match(decodeArray({ dtype: '<i4', shape: [3], data: 'AAAA' }).error, /not 12 bytes/);
  assert.match(decodeArray({ dtype: '<U4', shape: [1], data: 'AAAA' }).error, /not shown as numbers/);
  assert.match(decodeArray({ dtype: '|u1', shape: [3], data: '!!!!' }).error, /not base64/);
  assert.match(plain({ dtype: '<i4', shape: [3], data: 'AAAA' }), /^<array <i4 \(3\): /);
  assert.equal(isArrayValue({ dtype: '|u1', shape: [-1], data: '' }), false);
  assert.equal(isArrayValue([1, 2]), false);
  assert.equal(parseDtype('<f3'), null);
});

test('unravel gives C-order multi-indices', () => {
  assert.deepEqual(unravel(5, [2, 3]), [1, 2]);
  assert.deepEqual(unravel(7, [2, 2, 2]), [1, 1, 1]);
});

test('nested lists print one innermost list per line', () => {
  assert.equal(nestedText([1, 2]), '[1,2]');
  assert.equal(nestedText([[1, 2], [3, 4]]), '[[1,2],\n [3,4]]');
  assert.equal(nestedText([[[0, 1], [2, 3]], [[4, 5], [6, 7]]]), '[[[0,1],\n  [2,3]],\n\n [[4,5],\n  [6,7]]]');
  assert.equal(nestedText([[1], '… 3 more']), '[[1],\n "… 3 more"]');
});
