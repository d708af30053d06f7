// Examples per replica: which replicas were fed the same examples at the same step.
import { h, fmt } from '../dom.js';
import { createMatchMatrix, replicaText } from './match_matrix.js';

const pct = (v) => `${Math.round(100 * v)}%`;

export function createDataView(target, { data, deviceName, workerOf = () => null }) {
  if (!data || !data.steps.length) {
    target.append(h('p', { class: 'muted' }, 'No example fingerprints were recorded for this run (ReplicaCallback records them; custom loops call probe.observe_examples).'));
    return {};
  }
  const { replicas } = data;
  // examples_every > 1: only sampled steps were compared; the others are absent, not empty.
  const stepWord = data.sampled ? 'sampled steps' : 'steps';
  const matrix = createMatchMatrix({
    replicas,
    matrix: data.share,
    pooled: data.pooled,
    deviceName,
    workerOf,
    title: `Examples two replicas got at the same step (share of the smaller replica's, over ${data.total_steps} ${stepWord})`,
    cellText: (r, q) => (data.share[r][q] > 0 ? `${pct(data.share[r][q])} · ${data.steps_shared[r][q]} ${stepWord}` : '0'),
  });
  const rows = replicas.map((id, r) => {
    const distinct = data.total_distinct[r];
    const dup = data.total_duplicated[r];
    return h('tr', { class: dup > 0 ? 'desync' : null, dataset: { replica: id } }, [
      h('th', { scope: 'row' }, replicaText(id, workerOf)),
      h('td', {}, fmt(distinct)),
      h('td', {}, fmt(dup)),
      h('td', {}, distinct ? pct(dup / distinct) : '—'),
    ]);
  });
  const table = h('table', { class: 'shapes data-totals' }, [
    h('caption', {}, 'Over the run'),
    h('thead', {}, h('tr', {}, [h('th', {}, ''), h('th', {}, 'distinct examples'), h('th', {}, 'also on another replica'), h('th', {}, 'duplicated share')])),
    h('tbody', {}, rows),
  ]);
  target.append(h('div', { class: 'matrix-row' }, [matrix, h('div', { class: 'table-scroll' }, table)]));
  return {};
}
