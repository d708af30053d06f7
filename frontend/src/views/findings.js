// The findings panel: each finding of the run, most severe first; click one to see it.
// A finding grouping several of one cause (`items`) shows their count and expands to them.
import { h, shortList, fmt } from '../dom.js';
import { replicaName, replicasName } from '../names.js';

function stepsText({ first_step: a, last_step: b, count }) {
  if (a == null || Number.isNaN(a)) return null;
  const range = b == null || b === a ? `step ${a}` : `steps ${a}–${b}`;
  return count > 1 ? `${range} (${count} times)` : range;
}

function replicasText(replicas, workerOf) {
  if (!replicas.length) return null;
  const text = replicas.length === 1 ? replicaName(replicas[0]) : replicasName(shortList(replicas, 10));
  const workers = [...new Set(replicas.map(workerOf).filter(Boolean))];
  return workers.length ? `${text} on ${shortList(workers, 4)}` : text;
}

function itemsList(items, workerOf) {
  const rows = items.map((item) =>
    h('li', { class: 'finding-item', dataset: { severity: item.severity }, title: item.message }, [
      h('span', { class: 'item-name' }, item.name ?? '(whole batch)'),
      h(
        'span',
        { class: 'meta' },
        [stepsText(item), replicasText(item.replicas || [], workerOf), item.value != null && !Number.isNaN(item.value) ? `value ${fmt(item.value)}` : null]
          .filter(Boolean)
          .join(' · '),
      ),
    ]),
  );
  // A click on the toggle or the list expands or reads; it does not select the finding.
  const stop = (e) => e.stopPropagation();
  return h('details', { class: 'finding-items', onclick: stop, onkeydown: stop }, [
    h('summary', {}, `${items.length} items`),
    h('ul', {}, rows),
  ]);
}

export function createFindings(target, { findings, onSelect, workerOf = () => null }) {
  if (!findings.length) {
    target.append(h('p', { class: 'no-findings' }, 'No problems found in this run.'));
    return {};
  }
  const counts = {};
  for (const f of findings) counts[f.severity] = (counts[f.severity] || 0) + 1;
  target.append(
    h('p', { class: 'muted' }, [
      Object.entries(counts)
        .map(([s, c]) => `${c} ${s}${c === 1 ? '' : s === 'error' || s === 'warning' ? 's' : ''}`)
        .join(' · '),
      ' — click a finding to see it.',
    ]),
  );
  for (const f of findings) {
    const select = () => onSelect(f);
    const meta = [
      stepsText(f),
      replicasText(f.replicas, workerOf),
      f.name != null ? `${f.name}` : null,
      f.items?.length ? `${f.items.length} items` : null,
      f.value != null && !Number.isNaN(f.value) ? `value ${fmt(f.value)}` : null,
    ].filter(Boolean);
    target.append(
      h(
        'div',
        {
          class: 'finding',
          dataset: { severity: f.severity, kind: f.kind },
          role: 'button',
          tabindex: 0,
          title: 'Show in the charts',
          onclick: select,
          onkeydown: (e) => (e.key === 'Enter' || e.key === ' ') && (e.preventDefault(), select()),
        },
        [
          h('div', { class: 'finding-head' }, [
            h('span', { class: 'severity' }, f.severity),
            h('span', { class: 'kind' }, f.kind),
            h('span', { class: 'meta' }, meta.join(' · ')),
          ]),
          h('div', { class: 'message' }, f.message),
          f.items?.length ? itemsList(f.items, workerOf) : null,
        ],
      ),
    );
  }
  return {};
}
