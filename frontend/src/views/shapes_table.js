// Input shapes and dtypes per replica at each shape event; mismatching inputs highlighted.
import { h } from '../dom.js';
import { replicaName } from '../names.js';

const MAX_TABLES = 200;

// -1: a ragged dimension (its row lengths vary).
const dimText = (d) => (d == null ? '?' : d === -1 ? 'None' : String(d));

/** Cell key restricted to the mismatching dimensions, to find the odd replicas out. */
function signature(shape, dtype, dims) {
  return dims
    .map((d) => (d === 'dtype' ? dtype : d === 'rank' ? (Array.isArray(shape) ? shape.length : '?') : dimText(shape?.[d])))
    .join('|');
}

/** Replica positions whose cell differs: those outside a strict majority, else all of them. */
export function differingCells(input) {
  const n = input.shapes.length;
  if (!input.mismatch) return new Set();
  const dims = input.mismatch_dims.length ? input.mismatch_dims : ['dtype', 'rank'];
  const keys = input.shapes.map((s, r) => signature(s, input.dtypes[r], dims));
  const counts = new Map();
  for (const k of keys) counts.set(k, (counts.get(k) || 0) + 1);
  const [mode, count] = [...counts].sort((a, b) => b[1] - a[1])[0] || [null, 0];
  const odd = new Set();
  keys.forEach((k, r) => {
    if (count * 2 <= n || k !== mode) odd.add(r);
  });
  return odd;
}

function shapeCell(shape, dtype, mismatchDims, odd) {
  if (!Array.isArray(shape)) return h('td', { class: odd ? 'mismatch' : null }, '—');
  if (!odd) return h('td', {}, `[${shape.map(dimText).join(', ')}] ${dtype ?? '?'}`);
  // In a differing cell, the disagreeing dimensions and dtype are marked too.
  const mark = (text, on) => (on ? h('span', { class: 'dim-mismatch' }, text) : text);
  const parts = ['['];
  shape.forEach((d, i) => parts.push(i ? ', ' : '', mark(dimText(d), mismatchDims.includes(i))));
  parts.push('] ', mark(dtype ?? '?', mismatchDims.includes('dtype')));
  return h('td', { class: 'mismatch' }, parts);
}

/** A header row naming each worker of a multi-worker job over its replicas' columns. */
function workerRow(inputs) {
  if (!inputs.workers?.length) return null;
  return h('tr', { class: 'worker-row' }, [
    h('th', {}, 'worker'),
    ...inputs.workers.map((w) => h('th', { colspan: Math.max(1, w.replicas.length), dataset: { worker: w.name } }, w.name)),
  ]);
}

export function createShapesTable(target, { inputs, deviceName }) {
  const events = inputs.shape_events;
  if (!events.length) {
    target.append(h('p', { class: 'muted' }, 'No input shapes were recorded for this run.'));
    return {};
  }
  const workers = workerRow(inputs);
  const header = h('tr', {}, [
    h('th', {}, 'input'),
    ...inputs.replicas.map((id, r) => h('th', {}, deviceName(r) ? `${replicaName(id)} (${deviceName(r)})` : replicaName(id))),
  ]);
  if (events.length > MAX_TABLES) {
    target.append(h('p', { class: 'muted' }, `Showing the first ${MAX_TABLES} of ${events.length} shape changes.`));
  }
  for (const ev of events.slice(0, MAX_TABLES)) {
    const rows = ev.inputs.map((input) => {
      const odd = differingCells(input);
      return h('tr', { class: input.mismatch ? 'mismatch' : null }, [
        h('th', { scope: 'row' }, input.name),
        ...inputs.replicas.map((_, r) => shapeCell(input.shapes[r], input.dtypes[r], input.mismatch_dims, odd.has(r))),
      ]);
    });
    const table = h('table', { class: 'shapes', dataset: { step: ev.step } }, [
      h('caption', {}, `step ${ev.step}`),
      h('thead', {}, [workers?.cloneNode(true), header.cloneNode(true)]),
      h('tbody', {}, rows),
    ]);
    target.append(h('div', { class: 'table-scroll' }, table));
  }
  return {};
}
