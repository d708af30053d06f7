// The run view's status panel (`/status`): the run's state and root cause, one row per worker
// (a single run: one row), each stalled or crashed worker's main-thread stack and exception, and
// the recent status events. update(body) redraws it with a fresh `/status` body (at each reload:
// a status changes with time even when nothing else does).
import { h, shortList } from '../dom.js';
import { agoText, durationText, heartbeatAge, stateBadge, stateTone } from './status_badge.js';
import { replicaName, replicasName } from '../names.js';

const COLUMNS = ['worker', 'replicas', 'state', 'last step entered', 'last step completed', 'inside a step', 'last heartbeat', 'stalled for'];
const stepText = (step) => (step == null ? '—' : String(step));
const baseName = (file) => file.split(/[\\/]/).pop();
/** "train.py:9 in call" (`full`: the whole path). */
const place = (frame, full = false) => `${full ? frame.file : baseName(frame.file)}:${frame.line ?? '?'} in ${frame.function}`;
const replicasText = (replicas) => (replicas.length === 1 ? replicaName(replicas[0]) : replicasName(shortList(replicas, 10)));

function headline(body, multiWorker) {
  const parts = [stateBadge(body.state), heartbeatAge(body.state, body.age_s, 'last heartbeat ')];
  if (multiWorker) parts.push(h('span', { class: 'muted' }, `${body.workers.length} workers`));
  const cause = body.root_cause;
  return [
    h('div', { class: 'status-headline' }, parts),
    cause
      ? h('div', { class: 'root-cause', dataset: { kind: cause.kind, worker: cause.worker ?? '' } }, [
          h('strong', {}, 'Root cause'),
          cause.worker ? ` (${cause.worker}): ` : ': ',
          cause.message.replace(/^Root cause \(first observed failure\): /, ''),
        ])
      : null,
  ];
}

function workerRow(w) {
  const inStep = w.in_step == null ? '—' : w.in_step ? 'yes' : 'no';
  return h('tr', { dataset: { worker: w.name, state: w.state ?? 'none', tone: stateTone(w.state) } }, [
    h('th', { scope: 'row' }, w.name),
    h('td', {}, shortList(w.replicas, 8)),
    h('td', {}, stateBadge(w.state)),
    h('td', { class: 'num', dataset: { part: 'step' } }, stepText(w.step)),
    h('td', { class: 'num', dataset: { part: 'completed' } }, stepText(w.completed)),
    h('td', { dataset: { part: 'in-step' } }, inStep),
    h('td', { class: 'num', title: w.last_heartbeat == null ? null : new Date(w.last_heartbeat * 1000).toLocaleString() }, agoText(w.age_s)),
    h('td', { class: 'num' }, w.stalled_for_s == null ? '—' : durationText(w.stalled_for_s)),
  ]);
}

/** Frames outermost first: the user's own frames shown, each run of library frames collapsed. */
function frameList(frames) {
  const items = [];
  let library = [];
  const frameItem = (f) => h('li', { class: f.user ? 'frame user' : 'frame', title: place(f, true) }, place(f));
  const flush = () => {
    if (!library.length) return;
    const n = library.length;
    items.push(h('li', { class: 'library-frames' }, h('details', {}, [h('summary', {}, `${n} library frame${n === 1 ? '' : 's'}`), h('ol', {}, library.map(frameItem))])));
    library = [];
  };
  for (const f of frames) {
    if (f.user) {
      flush();
      items.push(frameItem(f));
    } else library.push(f);
  }
  flush();
  return h('ol', { class: 'stack' }, items);
}

/** What an exception names: replicas, devices, tasks (as the job names its workers: worker_1)
 * and the tasks it says stopped sending heartbeats. */
function namedText(e) {
  const names = (tasks) => tasks.map((t) => `${t.task_type}_${t.task_index}`);
  const unhealthy = names(e.unhealthy_tasks);
  const others = names(e.tasks).filter((t) => !unhealthy.includes(t));
  return [
    e.replicas.length ? replicasText(e.replicas) : null,
    e.devices.length ? `device${e.devices.length === 1 ? '' : 's'} ${shortList(e.devices, 4)}` : null,
    others.length ? `names ${shortList(others, 6)}` : null,
    unhealthy.length ? `${shortList(unhealthy, 6)} stopped sending heartbeats` : null,
  ].filter(Boolean);
}

function exceptionBlock(e) {
  const frame = e.user_frame;
  const facts = [
    e.step != null ? `step ${e.step}` : null,
    ...namedText(e),
    frame ? `in your code at ${place(frame)}` : null,
  ].filter(Boolean);
  return h('div', { class: 'status-exception' }, [
    h('p', { class: 'exception-head' }, [h('code', { class: 'exception-class', title: e.module ? `${e.module}.${e.class}` : null }, e.class || 'Exception'), e.first_line ? `: ${e.first_line}` : null]),
    facts.length ? h('p', { class: 'exception-facts' }, facts.join(' · ')) : null,
    e.node ? h('p', { class: 'muted' }, ['node ', h('code', {}, e.node)]) : null,
    h('details', { class: 'exception-message' }, [h('summary', {}, 'Full message'), h('pre', {}, e.message)]),
    e.frames.length ? h('details', { class: 'exception-traceback' }, [h('summary', {}, `Traceback (${e.frames.length} frames)`), frameList(e.frames)]) : null,
  ]);
}

/** A worker's exception and its training thread's stack, when it has either. */
function workerDetail(w, multiWorker) {
  if (!w.exception && !w.stack?.length) return null;
  return h('div', { class: 'worker-detail', dataset: { worker: w.name } }, [
    h('h3', {}, [multiWorker ? w.name : 'The run', stateBadge(w.state)]),
    w.exception ? exceptionBlock(w.exception) : null,
    w.stack?.length ? h('div', { class: 'main-stack' }, [h('p', { class: 'muted' }, "Main thread's latest recorded stack (written at a stall or on SIGUSR1), outermost call first, your frames in bold:"), frameList(w.stack)]) : null,
  ]);
}

function eventsList(body, multiWorker) {
  if (!body.events.length) return null;
  const time = (t) => (t == null ? '' : new Date(t * 1000).toLocaleTimeString());
  const items = body.events.map((e) =>
    h('li', { dataset: { type: e.type } }, [
      h('span', { class: 'event-time' }, time(e.wall_time)),
      multiWorker && e.worker ? h('span', { class: 'event-worker' }, e.worker) : null,
      e.summary,
      e.earlier_process ? h('span', { class: 'muted' }, ' (an earlier process)') : null,
      e.earlier_stretch ? h('span', { class: 'muted' }, ' (an earlier stretch)') : null,
    ]),
  );
  return h('details', { class: 'status-events' }, [h('summary', {}, `Recent events (${body.events.length})`), h('ul', {}, items)]);
}

function draw(target, body, multiWorker) {
  const crashes = body.earlier_crashes.map((c) => h('p', { class: 'note' }, `${c.same_process ? 'An earlier stretch of this process' : 'An earlier process of this run'}${c.worker ? ` (${c.worker})` : ''}: ${c.summary}`));
  const parts = [
    ...headline(body, multiWorker),
    h('div', { class: 'table-scroll' }, h('table', { class: 'status-workers' }, [h('thead', {}, h('tr', {}, COLUMNS.map((c) => h('th', {}, c)))), h('tbody', {}, body.workers.map(workerRow))])),
    ...body.workers.map((w) => workerDetail(w, multiWorker)),
    ...crashes,
    eventsList(body, multiWorker),
  ];
  target.replaceChildren(...parts.filter(Boolean));
  target.dataset.state = body.state ?? '';
}

/** Mounts the panel; `multiWorker`: the run is a job (rows are its workers). */
export function createStatusPanel(target, { status, multiWorker }) {
  draw(target, status, multiWorker);
  return {
    update(next) {
      const open = new Set(detailsKeys(target).filter(([d]) => d.open).map(([, key]) => key));
      draw(target, next, multiWorker);
      for (const [d, key] of detailsKeys(target)) if (open.has(key)) d.open = true;
    },
  };
}

/** Each <details> of the panel with a key that says which it is (its worker, its kind and its
 * rank among those), so a redraw keeps the ones the user opened open. */
function detailsKeys(target) {
  const seen = new Map();
  return [...target.querySelectorAll('details')].map((d) => {
    const kind = `${d.closest('[data-worker]')?.dataset.worker ?? ''}|${d.className || d.parentElement.className}`;
    seen.set(kind, (seen.get(kind) ?? 0) + 1);
    return [d, `${kind}|${seen.get(kind)}`];
  });
}
