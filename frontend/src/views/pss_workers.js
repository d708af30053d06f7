// ParameterServerStrategy: each worker's totals over every step it ran (also those past the
// slowest worker's last written step): steps run, seconds busy, seconds per step, steps per
// second; the workers a pss_straggler finding names are highlighted.
import { h, fmt } from '../dom.js';

const seconds = (v) => (v == null || !Number.isFinite(v) ? '—' : `${fmt(v, 3)} s`);
const rate = (v) => (v == null || !Number.isFinite(v) ? '—' : `${fmt(v, 2)}/s`);

/** "Worker 1 ran 3 steps at 15.6 steps/s; the others 37 at 195.8 (median)." per straggler. */
function summary(totals) {
  const { steps_run: steps, rate: rates, stragglers } = totals;
  if (!stragglers.length) return 'No worker runs far fewer steps per second than the others.';
  const middle = (values) => {
    const sorted = values.filter(Number.isFinite).sort((a, b) => a - b);
    const mid = sorted.length >> 1;
    return sorted.length % 2 ? sorted[mid] : (sorted[mid - 1] + sorted[mid]) / 2;
  };
  return stragglers
    .map((w) => {
      const others = steps.map((_, v) => v).filter((v) => v !== w);
      return `Worker ${w} ran ${steps[w]} steps at ${fmt(rates[w], 2)} steps/s while the others ran ${fmt(middle(others.map((v) => steps[v])), 1)} at ${fmt(middle(others.map((v) => rates[v])), 2)} steps/s (median): in asynchronous training its updates fall behind.`;
    })
    .join(' ');
}

/** Mounts the totals table into `target`; `totals` is `/step_time`'s `pss_workers`. */
export function createPssWorkers(target, { totals }) {
  const straggler = new Set(totals.stragglers);
  const rows = totals.steps_run.map((steps, w) =>
    h('tr', { class: straggler.has(w) ? 'slow' : null, dataset: { worker: String(w) } }, [
      h('th', { scope: 'row' }, `worker ${w}`),
      h('td', { class: 'num' }, String(steps)),
      h('td', { class: 'num' }, seconds(totals.busy[w])),
      h('td', { class: 'num' }, seconds(totals.step_seconds[w])),
      h('td', { class: 'num' }, rate(totals.rate[w])),
      h('td', {}, straggler.has(w) ? 'straggler' : ''),
    ]),
  );
  const head = ['worker', 'steps run', 'busy', 'per step (mean)', 'steps per second', ''];
  target.append(
    h('p', { class: 'ready-summary', dataset: { part: 'pss-summary' } }, summary(totals)),
    h('div', { class: 'table-scroll' }, h('table', { class: 'ready-times pss-workers' }, [
      h('thead', {}, h('tr', {}, head.map((t) => h('th', {}, t)))),
      h('tbody', {}, rows),
    ])),
  );
  return {};
}
