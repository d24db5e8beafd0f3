// Episode files: the one format of corral.episodes ("corral-episodes/1", JSON Lines).
// A header line, one "step" line per reset/step request (failed ones included), and an
// "end" line once the episode is over. Null fields are left out. The UI writes what the
// Python reader reads and reads what the Python writer writes; unknown fields are kept.

export const FORMAT = 'corral-episodes/1';
const SESSION_ENDING = new Set(['SESSION_LOST', 'UNKNOWN_SESSION', 'STEP_TIMEOUT', 'CONNECTION_LOST', 'CLIENT_CLOSED', 'FACTORY_ERROR', 'CAPACITY_REACHED']);

const compact = (obj) => Object.fromEntries(Object.entries(obj).filter(([, v]) => v !== null && v !== undefined));

function episodeId(ep) {
  return ep.episode || ep.id || `web-${Math.floor(ep.steps[0].t || Date.now())}`;
}

function success(step) {
  const meta = step.observation?.metadata;
  if (meta && typeof meta.success === 'boolean') return meta.success;
  return step.terminated && Number(step.reward || 0) > 0;
}

// The lines of one episode as the UI recorded it ({seed, options, steps: [...]}).
export function toLines(ep, meta) {
  const id = episodeId(ep);
  const session = ep.session ?? meta.session ?? null; // an imported episode keeps its own
  const header = {
    kind: 'header',
    format: FORMAT,
    created: new Date().toISOString(),
    env: compact({ name: meta.env ?? '', contract_version: meta.contract_version, fingerprint: meta.fingerprint }),
    source: 'web',
    url: meta.url,
    corral_version: meta.server?.version ?? '',
    meta: {},
  };
  const lines = [header];
  let total = 0;
  let length = 0;
  for (const [index, s] of ep.steps.entries()) {
    if (index > 0) length += 1;
    if (index > 0 && !s.error) total += Number(s.reward || 0);
    lines.push(
      compact({
        ...(s.extra || {}),
        kind: 'step',
        episode: id,
        session,
        index,
        op: index === 0 ? 'reset' : 'step',
        seed: ep.seed,
        task: ep.task,
        options: index === 0 ? ep.options : null,
        action: index === 0 ? null : s.action,
        observation: s.error ? null : s.observation,
        state: s.state,
        reward: s.error ? null : s.reward,
        reward_components: s.observation?.reward_components,
        terminated: Boolean(s.terminated),
        truncated: Boolean(s.truncated),
        t: (s.t ?? 0) / 1000,
        latency_s: s.ms === null || s.ms === undefined ? null : s.ms / 1000,
        error: s.error ? compact({ code: s.error.code, message: s.error.message ?? '', details: s.error.details ?? {} }) : null,
      }),
    );
  }
  const last = ep.steps[ep.steps.length - 1];
  const failed = last.error && SESSION_ENDING.has(last.error.code);
  if (!last.error ? last.terminated || last.truncated : failed) {
    const first = ep.steps[0];
    lines.push(
      compact({
        kind: 'end',
        episode: id,
        session,
        seed: ep.seed,
        task: ep.task,
        outcome: failed ? 'failed' : last.truncated ? 'truncated' : 'terminated',
        length,
        total_reward: Number.isFinite(total) ? total : null,
        success: failed ? null : success(last),
        duration_s: ((last.t ?? 0) + (last.ms ?? 0) - ((first.t ?? 0) - (first.ms ?? 0))) / 1000,
        error: failed ? { code: last.error.code, message: last.error.message ?? '', details: last.error.details ?? {} } : null,
      }),
    );
  }
  return lines;
}

export function toJsonl(ep, meta) {
  return toLines(ep, meta).map((line) => JSON.stringify(line)).join('\n') + '\n';
}

// Every episode of a file, in the order their first lines appear.
export function fromJsonl(text) {
  const episodes = new Map();
  let header = null;
  text.split(/\r?\n/).forEach((raw, i) => {
    if (!raw.trim()) return;
    let line;
    try {
      line = JSON.parse(raw);
    } catch (e) {
      throw new Error(`line ${i + 1} is not JSON: ${e.message}`, { cause: e });
    }
    if (line.kind === 'header') {
      const version = /^corral-episodes\/(\d+)$/.exec(line.format || '');
      if (!version) throw new Error(`line ${i + 1}: not an episode file (format ${JSON.stringify(line.format)})`);
      if (Number(version[1]) > 1) throw new Error(`line ${i + 1}: format ${line.format} is newer than this UI reads (${FORMAT})`);
      header = line;
      return;
    }
    if (!header) throw new Error(`line ${i + 1}: the file does not start with a header line`);
    if (line.kind === 'end') {
      const ep = episodes.get(`${header.created}/${line.episode}`);
      if (ep) ep.end = line;
      return;
    }
    if (line.kind !== 'step') return; // a kind from a newer minor revision
    if (typeof line.episode !== 'string' || !Number.isInteger(line.index) || !['reset', 'step'].includes(line.op)) {
      throw new Error(`line ${i + 1}: a step line needs episode, index and op`);
    }
    const key = `${header.created}/${line.episode}`;
    if (!episodes.has(key)) {
      episodes.set(key, { episode: line.episode, session: line.session ?? null, seed: line.seed ?? null, task: line.task ?? null, options: line.options ?? {}, steps: [], header, end: null });
    }
    const { kind, episode, session, index, op, seed, task, options, action, observation, state, reward, terminated, truncated, t, latency_s, error, reward_components, ...extra } = line;
    episodes.get(key).steps.push({
      kind: op,
      action: action ?? null,
      observation: observation ?? null,
      state: state ?? null,
      reward: reward ?? null,
      terminated: Boolean(terminated),
      truncated: Boolean(truncated),
      t: (t ?? 0) * 1000,
      ms: latency_s === undefined || latency_s === null ? null : latency_s * 1000,
      error: error ?? null,
      extra: Object.keys(extra).length ? extra : undefined,
    });
  });
  for (const ep of episodes.values()) {
    if (!ep.steps.length || ep.steps[0].kind !== 'reset') throw new Error(`episode ${ep.episode} does not start with its reset`);
  }
  return [...episodes.values()];
}

// One line naming an episode for a picker: id, seed, steps, outcome and return.
export function describe(ep) {
  let total = 0;
  for (const s of ep.steps.slice(1)) total += s.error ? 0 : Number(s.reward || 0);
  const outcome = ep.end?.outcome ?? (ep.steps.at(-1)?.terminated ? 'terminated' : ep.steps.at(-1)?.truncated ? 'truncated' : 'unfinished');
  const seed = ep.seed === null || ep.seed === undefined ? 'no seed' : `seed ${ep.seed}`;
  const task = ep.task ? `, task ${ep.task.split ?? ''}#${ep.task.index ?? ''}` : '';
  return `${ep.episode ?? 'episode'} · ${seed}${task} · ${ep.steps.length - 1} steps · ${outcome} · return ${+total.toFixed(4)}`;
}
