// Re-running a recorded episode on a session: the determinism check (verify) and the
// restore of an episode whose session the server no longer holds. Both replay the
// episode's reset (seed, options) and actions and compare each observation (or error
// code) with the recording; restore keeps the session and what it replayed as the live
// episode. Pure: the session comes in (anything with reset/step/state), no DOM.
//
// A server-side snapshot, where the environment has one, restores without replaying:
// restoreFromSnapshot() is the one place it plugs in (see there).

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

// THE PLUG-IN POINT for server-side snapshot/restore (the fleet work's corral/1 `snapshot`
// and `restore` requests). Given the new session and the expired episode, bring the
// session to the state the episode had reached and return {restored: steps} — the steps
// to show as live — or null when no snapshot can be used, in which case the episode is
// replayed. It needs a snapshot taken while the old session lived (kept with the episode,
// e.g. `ep.snapshot` refreshed after each step) or held by the server, and the welcome's
// word that the environment has one. corral/1 on this server has no snapshot request yet,
// so there is none to use.
export async function restoreFromSnapshot(_session, _ep) {
  return null;
}

// Restore `ep` on `session`: from a snapshot when there is one, else by replay (see
// replayEpisode). Returns {how: 'snapshot' | 'replay', diverged, replayed}.
export async function restoreEpisode(session, ep, options = {}) {
  const snapshot = await restoreFromSnapshot(session, ep);
  if (snapshot) return { how: 'snapshot', diverged: null, replayed: snapshot.restored.length, steps: snapshot.restored };
  return { how: 'replay', ...(await replayEpisode(session, ep, { ...options, withState: true })) };
}
