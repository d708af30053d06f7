// Step time per worker of a multi-worker job: a table of medians and busy seconds over steps.
import { h, fmt } from '../dom.js';
import { replicaColor } from '../colors.js';
import { valueAxis, mountStepChart } from './uplot_common.js';

const HEIGHT = 220;
const finiteOrNull = (v) => (typeof v === 'number' && Number.isFinite(v) ? v : null);
const seconds = (v) => (v == null || !Number.isFinite(v) ? '—' : `${fmt(v * 1000, 1)} ms`);

/**
 * Mounts the view. `stragglers` is the set of worker names a straggler finding names; their
 * rows are marked. Each worker's busy time is its step period minus the time it waited for the
 * last worker to arrive.
 */
export function createStepTime(target, { data, zoom, width, stragglers = new Set() }) {
  const { steps, workers } = data;
  const rows = workers.map((w, i) =>
    h('tr', { class: stragglers.has(w.name) ? 'straggler' : null, dataset: { worker: w.name } }, [
      h('th', { scope: 'row' }, w.name),
      h('td', {}, w.replicas.join(', ')),
      h('td', { class: 'num' }, seconds(data.median_busy[i])),
      h('td', { class: 'num' }, seconds(data.median_lateness[i])),
      h('td', {}, stragglers.has(w.name) ? 'straggler' : ''),
    ]),
  );
  target.append(
    h('div', { class: 'table-scroll' }, h('table', { class: 'step-time' }, [
      h('thead', {}, h('tr', {}, ['worker', 'replicas', 'busy per step (median)', 'arrives after the first (median)', ''].map((t) => h('th', {}, t)))),
      h('tbody', {}, rows),
    ])),
  );
  if (!steps.length) {
    target.append(h('p', { class: 'muted' }, 'No step times were recorded for this job.'));
    return {};
  }
  const chart = h('div', { class: 'chart' });
  target.append(chart);
  const columns = workers.map((_, i) => steps.map((_, s) => finiteOrNull(data.busy[s]?.[i])));
  return mountStepChart(chart, {
    zoom,
    width,
    height: HEIGHT,
    yScale: { range: (u, min, max) => [0, max > 0 ? max * 1.1 : 1] },
    yAxis: valueAxis(data.downsampled ? 'busy s (bucket mean)' : 'busy seconds / step'),
    series: workers.map((w, i) => ({
      label: w.name,
      stroke: replicaColor(i),
      width: stragglers.has(w.name) ? 2 : 1.25,
      points: { show: steps.length < 60 },
      value: (u, v) => seconds(v),
    })),
  }, [steps, ...columns]);
}
