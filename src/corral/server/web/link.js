// The shareable link: an episode's seed, reset options and actions in the URL's fragment
// (#seed=7&options={...}&actions=[...]), which never reaches the server. A link is data
// from someone else: the page shows what it holds and replays nothing until the user
// says so (see play.js). Pure: no DOM, no globals.

// The fragment (without '#') for an episode {seed, options, actions}.
export function formatLink({ seed, options, actions }) {
  const params = new URLSearchParams();
  if (seed !== null && seed !== undefined) params.set('seed', String(seed));
  if (options && Object.keys(options).length) params.set('options', JSON.stringify(options));
  params.set('actions', JSON.stringify(actions));
  return params.toString();
}

// What a fragment holds: null when it names no episode, {error} when it names one badly,
// else {seed, options, actions}.
export function parseLink(fragment) {
  const params = new URLSearchParams(fragment.startsWith('#') ? fragment.slice(1) : fragment);
  if (!params.has('actions') && !params.has('seed')) return null;
  let seed = null;
  if (params.has('seed')) {
    const raw = params.get('seed');
    seed = /^\d+$/.test(raw) ? Number(raw) : NaN;
    if (!Number.isSafeInteger(seed)) return { error: `the seed ${JSON.stringify(raw.slice(0, 40))} is not a whole number` };
  }
  let options;
  let actions;
  try {
    options = JSON.parse(params.get('options') || '{}');
    actions = JSON.parse(params.get('actions') || '[]');
  } catch (e) {
    return { error: `the link does not hold readable JSON (${e.message})` };
  }
  if (options === null || typeof options !== 'object' || Array.isArray(options)) {
    return { error: 'the link\'s reset options are not a JSON object' };
  }
  if (!Array.isArray(actions)) return { error: 'the link\'s actions are not a JSON list' };
  return { seed, options, actions };
}
