// How a run is going, in words: the state badge and heartbeat age the overview and the status
// panel share (families/status: running · finished · halted · crashed · interrupted · stalled ·
// silent; null for a run written before the status family).
import { h } from '../dom.js';

/** States whose last heartbeat's age matters: the run has not ended. */
const ONGOING = new Set(['running', 'stalled', 'silent']);
/** States that are a failure (drawn red); halted and interrupted ended on purpose (amber). */
const FAILED = new Set(['crashed', 'stalled', 'silent']);
const STOPPED = new Set(['halted', 'interrupted']);

/** "error", "warning" or "ok": how a state is coloured (the word says it too). */
export const stateTone = (state) => (FAILED.has(state) ? 'error' : STOPPED.has(state) ? 'warning' : state ? 'ok' : 'none');

/** "12 s", "3 min", "2.5 h", "4 d": a duration in seconds, short. */
export function durationText(seconds) {
  if (seconds == null || !Number.isFinite(seconds)) return '—';
  const s = Math.max(0, seconds);
  if (s < 90) return `${Math.round(s)} s`;
  if (s < 90 * 60) return `${Math.round(s / 60)} min`;
  if (s < 36 * 3600) return `${+(s / 3600).toFixed(1)} h`;
  return `${Math.round(s / 86400)} d`;
}

/** "12 s ago" ("—" when unknown). */
export const agoText = (seconds) => (seconds == null || !Number.isFinite(seconds) ? '—' : `${durationText(seconds)} ago`);

/** The state as a word in a badge ("—" for a run without status data). */
export function stateBadge(state) {
  return h('span', { class: 'state-badge', dataset: { state: state ?? 'none', tone: stateTone(state) } }, state ?? '—');
}

/** The age of the last heartbeat, for a run that has not ended ("last heartbeat 12 s ago"), else null. */
export function heartbeatAge(state, ageS, prefix = '') {
  if (!ONGOING.has(state) || ageS == null) return null;
  return h('span', { class: 'heartbeat-age', title: 'Age of the last heartbeat' }, `${prefix}${agoText(ageS)}`);
}

const ROOT_CAUSE = /^Root cause \(first observed failure\): /;

/** `text` cut to its first sentence, and to about `max` characters at a word ("…" marks a cut);
 * a job's root cause starts "Root cause: ". */
export function shortened(text, max = 160) {
  const plain = text.replace(ROOT_CAUSE, 'Root cause: ');
  const first = /^(.+?[.!?])(\s|$)/s.exec(plain)?.[1] ?? plain;
  if (first.length <= max) return first;
  const cut = first.slice(0, max);
  return `${cut.slice(0, Math.max(cut.lastIndexOf(' '), max / 2)).replace(/[\s,;:]+$/, '')}…`;
}
