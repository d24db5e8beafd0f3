// The episodes a tab holds: live, expired (kept), imported (kept), and which is shown.

import { test } from 'node:test';
import assert from 'node:assert/strict';
import { Book, MAX_KEPT } from '../../../../src/corral/server/web/book.js';

const ep = (id, steps = 2) => ({ episode: id, seed: 1, options: {}, steps: Array.from({ length: steps + 1 }, (_, i) => ({ kind: i ? 'step' : 'reset', reward: 0 })) });

test('an expired live episode is kept, shown at its last step, and read-only', () => {
  const book = new Book();
  const live = ep('a', 3);
  book.begin(live);
  assert.equal(book.readOnly, false);
  book.expire({ code: 'SESSION_LOST', message: 'gone' }, 5);
  assert.equal(book.live, null);
  assert.equal(book.shown, live);
  assert.equal(book.selected, 3);
  assert.equal(book.readOnly, true);
  assert.deepEqual(live.expired, { code: 'SESSION_LOST', message: 'gone', at: 5 });
  // A new live episode (a restore) keeps the expired one in the list.
  const next = ep('b');
  book.begin(next);
  assert.deepEqual(book.entries().map((e) => e.ep), [next, live]);
  assert.match(book.entries()[1].label, /^expired session · a · seed 1 · 3 steps/);
});

test('every episode of an imported file is listed, the first shown', () => {
  const book = new Book();
  book.begin(ep('live'));
  const file = [ep('x'), ep('y'), ep('z')];
  assert.deepEqual(book.importFile(file, 'run.jsonl'), { listed: 3, of: 3 });
  assert.equal(book.shown, file[0]);
  assert.equal(book.readOnly, true);
  assert.deepEqual(book.entries().map((e) => e.label.split(' · ')[0]), ['live', 'imported run.jsonl', 'imported run.jsonl', 'imported run.jsonl']);
});

test('a huge file lists its first MAX_KEPT episodes; an expired one is never pushed out', () => {
  const book = new Book();
  book.begin(ep('live'));
  book.expire({ code: 'SESSION_LOST' });
  const file = Array.from({ length: MAX_KEPT + 5 }, (_, i) => ep(`e${i}`));
  assert.deepEqual(book.importFile(file, 'big.jsonl'), { listed: MAX_KEPT, of: MAX_KEPT + 5 });
  assert.equal(book.kept.length, MAX_KEPT);
  assert.ok(book.kept.some((k) => k.kept === 'expired'));
});
