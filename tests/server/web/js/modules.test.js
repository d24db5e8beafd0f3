// Every name a web UI module imports is exported by the module it names. ESLint does not
// follow imports, and main.js (which runs on import) is only linked in a browser: a name
// dropped from one module would otherwise surface as a blank page.

import { test } from 'node:test';
import assert from 'node:assert/strict';
import { readdirSync, readFileSync } from 'node:fs';
import { WEB } from './support.js';

const IMPORT = /import\s*\{([^}]*)\}\s*from\s*'(\.\/[\w-]+\.js)'/g;
const modules = readdirSync(WEB).filter((name) => name.endsWith('.js'));

test('the UI is split into modules: main.js (the wiring) under 250 lines, any over 500 says why', () => {
  assert.ok(modules.length >= 15, modules.join(', '));
  for (const name of modules) {
    const lines = readFileSync(new URL(name, WEB), 'utf8').split('\n');
    const head = lines.slice(0, 15).join('\n');
    if (lines.length > 500) assert.match(head, /over 500 lines as one thing/i, `${name} has ${lines.length} lines`);
    if (name === 'main.js') assert.ok(lines.length <= 250, `main.js has ${lines.length} lines`);
  }
});

for (const name of modules) {
  test(`${name}: every imported name exists`, async () => {
    const source = readFileSync(new URL(name, WEB), 'utf8');
    for (const [, names, from] of source.matchAll(IMPORT)) {
      const exported = await import(new URL(from, WEB));
      for (const raw of names.split(',')) {
        const imported = raw.trim().split(/\s+as\s+/)[0];
        if (imported) assert.ok(imported in exported, `${name} imports ${imported} from ${from}, which does not export it`);
      }
    }
  });
}

test('no module but main.js reads or writes window.corral', () => {
  for (const name of modules) {
    if (name === 'main.js') continue;
    const source = readFileSync(new URL(name, WEB), 'utf8');
    assert.ok(!/window\.corral/.test(source), name);
  }
});
