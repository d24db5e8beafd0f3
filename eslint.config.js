// ESLint for the web UI's ES modules and their node tests (make js).
// The UI runs in browsers without a build step: modules only, browser globals only; the
// tests run under node. Rules beyond "recommended" catch what bit us: implicit globals,
// == coercions, unused code.
import js from '@eslint/js';
import globals from 'globals';

export default [
  { ignores: ['node_modules/**', '.venv/**'] },
  js.configs.recommended,
  {
    files: ['src/corral/server/web/**/*.js'],
    languageOptions: { ecmaVersion: 2023, sourceType: 'module', globals: { ...globals.browser } },
  },
  {
    files: ['tests/server/web/js/**/*.js', 'eslint.config.js'],
    languageOptions: { ecmaVersion: 2023, sourceType: 'module', globals: { ...globals.node } },
  },
  {
    rules: {
      eqeqeq: ['error', 'always', { null: 'ignore' }],
      'no-implicit-globals': 'error',
      'no-var': 'error',
      'prefer-const': 'error',
      'no-shadow': 'error',
      'no-unused-vars': ['error', { args: 'after-used', argsIgnorePattern: '^_', ignoreRestSiblings: true, caughtErrors: 'none' }],
      'no-restricted-properties': [
        'error',
        { property: 'innerHTML', message: 'data reaches the page as text (textContent / h()), never as markup' },
        { property: 'outerHTML', message: 'data reaches the page as text, never as markup' },
      ],
      'no-restricted-syntax': [
        'error',
        { selector: "CallExpression[callee.property.name='insertAdjacentHTML']", message: 'no markup from strings' },
        { selector: "AssignmentExpression[left.object.name='window'][left.property.name!='corral']", message: 'no globals on window' },
      ],
    },
  },
];
