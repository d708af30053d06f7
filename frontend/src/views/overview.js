// The runs overview, the tab's landing view: every run and job, worst first, with a regex filter.
// A click on a run opens its view (onOpen); update(runs) redraws it with fresh /overview entries.
import { h } from '../dom.js';
import { heartbeatAge, shortened, stateBadge } from './status_badge.js';

const COLUMNS = ['Run', 'Status', 'Errors', 'Warnings', 'Info', 'Replicas', 'Workers', 'Steps', 'Families'];

/** The filter as a case-insensitive regex (like TensorBoard's run selector), or an error text. */
export function runFilter(text) {
  if (!text) return { test: () => true };
  try {
    return new RegExp(text, 'i');
  } catch (e) {
    return { error: `Not a regular expression: ${e.message}`, test: () => false };
  }
}

/** The status cell: the state as a word, the last heartbeat's age while the run has not ended,
 * and the worst status finding in words (shortened; the whole text on hover). */
function statusCell({ state, age_s: age, worst: text }) {
  return h('td', { class: 'status-cell', dataset: { state: state ?? 'none' } }, [
    stateBadge(state),
    heartbeatAge(state, age),
    text ? h('div', { class: 'status-worst', title: text }, shortened(text)) : null,
  ]);
}

/** A severity count: coloured only when it is not zero (a zero is neutral). */
const countCell = (counts, severity) => {
  const n = counts[severity] ?? 0;
  return h('td', { class: 'count', dataset: { severity, count: String(n) } }, String(n));
};

const worst = (counts) => (counts.error ? 'error' : counts.warning ? 'warning' : counts.info ? 'info' : 'clean');

function row(run, onOpen) {
  const counts = run.findings || {};
  const steps = run.first_step == null ? '—' : `${run.first_step}–${run.last_step}`;
  const link = h('a', { href: `#run=${encodeURIComponent(run.run)}`, class: 'overview-run' }, run.run);
  const tr = h('tr', { dataset: { run: run.run, severity: worst(counts) } }, [
    h('td', {}, link),
    statusCell(run.status),
    countCell(counts, 'error'),
    countCell(counts, 'warning'),
    countCell(counts, 'info'),
    h('td', { class: 'count' }, String(run.replicas.length)),
    h('td', { class: 'count' }, run.workers.length ? String(run.workers.length) : '1'),
    h('td', {}, steps),
    h('td', { class: 'muted' }, run.families.join(', ')),
  ]);
  tr.addEventListener('click', (event) => {
    event.preventDefault();
    onOpen(run.run);
  });
  return tr;
}

/**
 * Draws the overview into `target`.
 * runs: /overview entries (worst first); onOpen(runName): open that run; filter: initial text.
 * Returns {update(runs), filterText(), destroy()}.
 */
export function createOverview(target, { runs, onOpen, filter = '' }) {
  const input = h('input', {
    id: 'overview-filter',
    type: 'search',
    placeholder: 'Filter runs (regular expression)',
    value: filter,
    'aria-label': 'Filter runs (regular expression)',
  });
  const message = h('span', { class: 'muted overview-count' });
  const tbody = h('tbody');
  const table = h('table', { class: 'overview' }, [h('thead', {}, h('tr', {}, COLUMNS.map((c) => h('th', {}, c)))), tbody]);
  target.append(h('div', { class: 'overview-filter' }, [input, message]), table);
  let current = runs;

  function draw() {
    const match = runFilter(input.value);
    const shown = current.filter((r) => match.test(r.run));
    tbody.replaceChildren(...shown.map((r) => row(r, onOpen)));
    message.textContent = match.error ?? `${shown.length} of ${current.length} runs`;
    message.classList.toggle('error-text', Boolean(match.error));
  }
  input.addEventListener('input', draw);
  draw();
  return {
    update(runs) {
      current = runs;
      draw();
    },
    filterText: () => input.value,
    destroy() {
      target.replaceChildren();
    },
  };
}
