// Watched values (ReplicaProbe.watch; "outputs" in fit): local shapes per replica at every change,
// and the stats of every leaf per replica at the latest sampled step.
import { h, fmt } from '../dom.js';
import { createShapesTable } from './shapes_table.js';
import { replicaName } from '../names.js';

const MAX_LISTED_STEPS = 20;

/** The stats table of one value at its latest stats step: one row per leaf and stat. */
function statsTable(value, watch, deviceName) {
  const steps = value.stats.steps;
  if (!steps.length) return h('p', { class: 'muted' }, 'No stats recorded yet (they are written at sampled steps).');
  const last = steps.length - 1;
  const header = h('tr', {}, [
    h('th', {}, 'leaf'),
    h('th', {}, 'stat'),
    ...watch.replicas.map((id, r) => h('th', {}, deviceName(r) ? `${replicaName(id)} (${deviceName(r)})` : replicaName(id))),
  ]);
  const rows = [];
  value.stats.values[last].forEach((leaf, l) => {
    let first = true; // the leaf is named on its first row
    leaf.forEach((row, s) => {
      if (row.every((v) => v == null)) return; // a stat that does not apply to this leaf
      const name = first ? value.leaves[l] ?? `leaf ${l}` : '';
      first = false;
      rows.push(
        h('tr', { dataset: { stat: watch.stat_rows[s] } }, [
          h('th', { scope: 'row' }, name),
          h('td', {}, watch.stat_rows[s]),
          ...row.map((v) => h('td', { class: ['nan', 'inf'].includes(watch.stat_rows[s]) && v > 0 ? 'mismatch' : null }, fmt(v))),
        ]),
      );
    });
  });
  return h('div', { class: 'table-scroll' }, h('table', { class: 'shapes watch-stats', dataset: { step: steps[last] } }, [
    h('caption', {}, `stats at step ${steps[last]}`),
    h('thead', {}, header),
    h('tbody', {}, rows),
  ]));
}

export function createWatchView(target, { watch, deviceName }) {
  if (!watch.values.length) {
    target.append(h('p', { class: 'muted' }, 'No watched values in this run.'));
    return {};
  }
  for (const value of watch.values) {
    const block = h('div', { class: 'watched', dataset: { watched: value.name } }, h('h3', {}, value.name));
    target.append(block);
    const nonfinite = value.nonfinite.steps;
    if (nonfinite.length) {
      const listed = nonfinite.slice(0, MAX_LISTED_STEPS).join(', ') + (nonfinite.length > MAX_LISTED_STEPS ? ', …' : '');
      block.append(h('p', { class: 'note', dataset: { severity: 'error' } }, `NaN or Inf at step${nonfinite.length === 1 ? '' : 's'} ${listed}.`));
    }
    createShapesTable(block, {
      inputs: { replicas: watch.replicas, workers: [], shape_events: value.shape_events.map((e) => ({ step: e.step, inputs: e.leaves })) },
      deviceName,
    });
    block.append(statsTable(value, watch, deviceName));
  }
  return {};
}
