// Re-running a recorded episode on a session: the determinism check (verify) and the
// restore of an episode whose session the server no longer holds. Both replay the
// episode's reset (seed, options) and actions and compare each observation (or error
// code) with the recording; restore keeps the session and what it replayed as the live
// episode. Pure: the session comes in (anything with reset/step/state), no DOM.
//
// Where the env has snapshots, restoreFromSnapshot() restores the last one instead.

import { equal } from './values.js';
import { sessionGone } from './reconnect.js';

// The difference between a recorded step and its replay, or null when they agree:
// {index, recorded, replayed}.
// A step recorded without its outcome (a shared link holds actions only) matches any.
export function compareStep(index, step, observation, error) {
  if (step.observation === undefined && !step.error) return null;
  if (step.error || error) {
    if ((step.error?.code ?? null) === (error?.code ?? null)) return null;
    return {
      index,
      recorded: step.error ? { code: step.error.code, message: step.error.message } : step.observation,
      replayed: error ? { code: error.code, message: error.message } : observation,
    };
  }
  return equal(step.observation, observation) ? null : { index, recorded: step.observation, replayed: observation };
}

// The recorded steps worth replaying: a last step that failed because the session or
// connection went (the request never ran to an answer) is left out.
export function replayable(ep) {
  const steps = ep.steps;
  const last = steps.at(-1);
  return steps.length > 1 && last.error && (sessionGone(last.error) || last.error.code === 'CONNECTION_LOST') ? steps.slice(0, -1) : steps;
}

// Replay `ep` on `session`, step by step, stopping at the first difference. Calls
// onStep(index, {reply, ms, error, state}) after each request (state only withState).
// Returns {diverged: {index, recorded, replayed} | null, replayed: count}. A failure that
// is not an answer about the step (the connection or session gone) is thrown.
export async function replayEpisode(session, ep, { onStep = () => {}, withState = false } = {}) {
  const steps = replayable(ep);
  for (let i = 0; i < steps.length; i++) {
    const step = steps[i];
    let reply = null;
    let ms;
    let error = null;
    try {
      ({ reply, ms } = i === 0 ? await session.reset(ep.seed, ep.options) : await session.step(step.action));
    } catch (e) {
      if (!e.code || sessionGone(e) || e.code === 'CONNECTION_LOST') throw e;
      error = e;
      ms = e.ms ?? null;
    }
    const state = withState && !error ? await session.state().catch(() => null) : null;
    await onStep(i, { reply, ms, error, state });
    const differs = compareStep(i, step, reply ? reply.observation : null, error);
    if (differs) return { diverged: differs, replayed: i + 1 };
  }
  return { diverged: null, replayed: steps.length };
}

// Snapshots an episode keeps, the latest (each as large as the env's state).
export const SNAPSHOTS_KEPT = 32;

// Keep the snapshot taken after step `index` of `ep` (ep.snapshots, never in a file).
export function keepSnapshot(ep, index, envelope) {
  ep.snapshots ??= new Map();
  ep.snapshots.delete(index);
  ep.snapshots.set(index, envelope);
  while (ep.snapshots.size > SNAPSHOTS_KEPT) ep.snapshots.delete(ep.snapshots.keys().next().value);
}

// The snapshot kept of step `index` of `ep`, or null.
export function snapshotAt(ep, index) {
  return ep.snapshots?.get(index) ?? null;
}

// A restore refused with these: replay instead.
const UNUSABLE = new Set(['BAD_SNAPSHOT', 'SNAPSHOT_UNSUPPORTED', 'SNAPSHOT_TOO_LARGE', 'CONTRACT_MISMATCH']);

// Restore `ep` from the snapshot of its last step in place of `session` (the fresh one):
// {restored: steps, session}, or null (no snapshot, or refused: replay instead).
export async function restoreFromSnapshot(session, ep) {
  const steps = replayable(ep);
  const envelope = snapshotAt(ep, steps.length - 1);
  if (!envelope || typeof session.replacedBy !== 'function') return null;
  try {
    // A copy: the live episode grows, the expired one stays.
    return { restored: steps.map((step) => ({ ...step })), session: await session.replacedBy(envelope) };
  } catch (e) {
    if (UNUSABLE.has(e.code)) return null;
    throw e;
  }
}

// Restore `ep` on `session`: from a snapshot when there is one, else by replay (see
// replayEpisode). Returns {how: 'snapshot' | 'replay', diverged, replayed}.
export async function restoreEpisode(session, ep, options = {}) {
  const snapshot = await restoreFromSnapshot(session, ep);
  if (snapshot) return { how: 'snapshot', diverged: null, replayed: snapshot.restored.length, steps: snapshot.restored, session: snapshot.session };
  return { how: 'replay', ...(await replayEpisode(session, ep, { ...options, withState: true })) };
}
