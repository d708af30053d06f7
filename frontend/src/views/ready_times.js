// Each replica's ready time per step (until its local gradients reach the host): a line per
// replica (or per block of replicas: its slowest), the slow replicas drawn thick, and a table of
// the slowest replicas with their medians, maxima and waits.
import { h, fmt } from '../dom.js';
import { replicaColor } from '../colors.js';
import { replicaColumns } from './match_matrix.js';
import { valueAxis, mountStepChart } from './uplot_common.js';
import { replicaName, replicaNoun } from '../names.js';

const HEIGHT = 240;
/** The table lists every replica up to this many, else the slowest this many. */
export const TABLE_ROWS = 16;
/** "GPU:1" from "/job:worker/replica:0/task:1/device:GPU:1" (its worker is said apart). */
const shortDevice = (d) => /device:([^/]+)$/.exec(d || '')?.[1] ?? (d || '');
const ms = (v) => (v == null || !Number.isFinite(v) ? null : v * 1000);
const msText = (v) => (v == null || !Number.isFinite(v) ? '—' : `${fmt(v * 1000, 1)} ms`);
const median = (values) => {
  const sorted = values.filter(Number.isFinite).sort((a, b) => a - b);
  if (!sorted.length) return NaN;
  const mid = sorted.length >> 1;
  return sorted.length % 2 ? sorted[mid] : (sorted[mid - 1] + sorted[mid]) / 2;
};

/**
 * The positions of the replicas the table lists: all up to TABLE_ROWS, else the slowest
 * TABLE_ROWS (and every slow one), in replica order.
 */
export function tableRows(ready, slow) {
  const positions = ready.replicas.map((_, p) => p);
  if (positions.length <= TABLE_ROWS) return positions;
  const key = (p) => (Number.isFinite(ready.median_ready[p]) ? ready.median_ready[p] : -Infinity);
  const slowest = [...positions].sort((a, b) => key(b) - key(a)).slice(0, TABLE_ROWS);
  const kept = new Set([...slowest, ...positions.filter((p) => slow.has(ready.replicas[p]))]);
  return positions.filter((p) => kept.has(p));
}

/** "Worker 1 is slow: ..." under ParameterServerStrategy: its step seconds against the others'. */
function slowWorkerText(ready, p) {
  const others = ready.replicas.map((_, q) => q).filter((q) => q !== p);
  const base = median(others.map((q) => ready.median_ready[q]));
  const place = shortDevice(ready.devices[p]);
  return `Worker ${ready.replicas[p]}${place ? ` (${place})` : ''} is slow: its steps take ${msText(ready.median_ready[p])} against ${msText(base)} for the other workers.`;
}

/** "Replica 1 is slow: ..." for each slow replica, against the other replicas of its worker. */
function slowText(ready, slow) {
  const lines = [];
  ready.replicas.forEach((id, p) => {
    if (!slow.has(id)) return;
    if (replicaNoun() === 'worker') {
      lines.push(slowWorkerText(ready, p));
      return;
    }
    const worker = ready.workers[p] ?? null;
    const others = ready.replicas.map((_, q) => q).filter((q) => q !== p && (ready.workers[q] ?? null) === worker);
    const base = median(others.map((q) => ready.median_ready[q]));
    const wait = median(others.map((q) => ready.median_wait[q]));
    const where = worker ? `the other replicas of ${worker}` : 'the other replicas';
    const place = [shortDevice(ready.devices[p]), worker].filter(Boolean).join(' on ');
    lines.push(
      `Replica ${id}${place ? ` (${place})` : ''} is slow: ready ${msText(ready.median_ready[p])} after the step starts against ${msText(base)} for ${where}, which wait ${msText(wait)} per step for it.`,
    );
  });
  return lines;
}

/** The table of the listed replicas: device, median and max ready time, median wait. */
function readyTable(ready, slow, workerOf) {
  const rows = tableRows(ready, slow).map((p) => {
    const id = ready.replicas[p];
    const isSlow = slow.has(id);
    return h('tr', { class: isSlow ? 'slow' : null, dataset: { replica: String(id) } }, [
      h('th', { scope: 'row' }, replicaName(id)),
      h('td', {}, [shortDevice(ready.devices[p]), workerOf(id)].filter(Boolean).join(' · ')),
      h('td', { class: 'num' }, msText(ready.median_ready[p])),
      h('td', { class: 'num' }, msText(ready.max_ready[p])),
      h('td', { class: 'num' }, msText(ready.median_wait[p])),
      h('td', {}, isSlow ? `slow ${replicaNoun()}` : ''),
    ]);
  });
  const head = replicaNoun() === 'worker'
    ? ['worker', 'device', 'step (median)', 'step (max)', 'waits (none: asynchronous)', '']
    : [replicaNoun(), 'device', 'ready (median)', 'ready (max)', 'waits for the slowest (median)', ''];
  return h('div', { class: 'table-scroll' }, h('table', { class: 'ready-times' }, [
    h('thead', {}, h('tr', {}, head.map((t) => h('th', {}, t)))),
    h('tbody', {}, rows),
  ]));
}

/**
 * Mounts the view into `target`. `ready` is `/step_time`'s `ready`; `slow` the set of replica ids
 * a slow_replica finding names (their lines are thick, their rows highlighted).
 */
export function createReadyTimes(target, { ready, zoom, width, slow = new Set(), workerOf = () => null }) {
  const { steps } = ready;
  const lines = replicaColumns(ready, workerOf);
  const spans = ready.pooled ? ready.pooled.blocks : ready.replicas.map((_, p) => [p, p]);
  const isSlow = spans.map(([first, last]) => ready.replicas.slice(first, last + 1).some((id) => slow.has(id)));
  const sentences = slowText(ready, slow);
  target.append(
    h('p', { class: 'ready-summary', dataset: { part: 'ready-summary' } }, [
      sentences.length
        ? sentences.join(' ')
        : replicaNoun() === 'worker'
          ? "No worker's steps are slower than the others'."
          : 'No replica is slower than the others of its worker.',
      ready.pooled ? ` ${ready.replicas.length} replicas in ${lines.length} blocks: each line the slowest of its replicas.` : '',
    ]),
    readyTable(ready, slow, workerOf),
  );
  if (ready.replicas.length > TABLE_ROWS) {
    target.append(h('p', { class: 'muted' }, `The ${TABLE_ROWS} slowest of ${ready.replicas.length} replicas.`));
  }
  if (!steps.length) return {};
  const chart = h('div', { class: 'chart', dataset: { part: 'ready-chart', lines: String(lines.length) } });
  target.append(chart);
  const columns = lines.map((_, r) => steps.map((_, i) => ms(ready.median[i]?.[r])));
  // The y axis fits the windows the figures use: a warm-up window (the first, of one step) that
  // takes seconds would flatten every other line; it is cut at the top instead.
  const skip = ready.warm_up && steps.length > 1 ? 1 : 0;
  const top = Math.max(0, ...columns.flatMap((c) => c.slice(skip).filter((v) => v != null)));
  if (skip) {
    const first = Math.max(0, ...columns.map((c) => c[0] ?? 0));
    const cut = first > top * 1.1 ? ` (${fmt(first, 1)} ms: above the chart)` : '';
    target.append(h('p', { class: 'muted', dataset: { part: 'warm-up' } }, `The first logged window, step ${steps[0]}, holds one step only: a warm-up${cut}, left out of the table's figures.`));
  }
  return mountStepChart(chart, {
    zoom,
    width,
    height: HEIGHT,
    yScale: { range: () => [0, top > 0 ? top * 1.1 : 1] },
    yAxis: valueAxis(ready.downsampled ? 'ready ms (bucket mean)' : 'ready ms (window median)'),
    series: lines.map((line, r) => ({
      label: isSlow[r] ? `${line.label} (slow)` : line.label,
      stroke: replicaColor(r),
      width: isSlow[r] ? 3 : 1.25,
      points: { show: steps.length < 60 },
      value: (u, v) => (v == null ? '—' : `${fmt(v, 1)} ms`),
    })),
  }, [steps, ...columns]);
}
