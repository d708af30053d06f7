// Imbalance (max / min batch size over replicas) per step. Infinite values (a replica got
// nothing while another got examples) are drawn at a cap above the finite ones and marked.
import { fmt } from '../dom.js';
import { valueAxis, mountStepChart, steppedOrDense } from './uplot_common.js';

const HEIGHT = 200;
const EMPTY_COLOR = '#e53935';

/** The y value at which infinite ratios are drawn: well above every finite one. */
export function imbalanceCap(values) {
  let top = 1;
  for (const v of values) if (Number.isFinite(v) && v > top) top = v;
  return Math.max(2, Math.ceil(top * 1.5));
}

/** max / min of a set of batch sizes: Infinity when one is empty and another is not. */
function ratio(hi, lo) {
  if (!(hi >= 0) || !(lo >= 0)) return NaN;
  if (hi === 0) return 1;
  return lo === 0 ? Infinity : hi / lo;
}

/** Per bucket: largest batch of any replica over smallest batch of any replica in the bucket. */
export function bucketBound(inputs) {
  return inputs.steps.map((_, i) => {
    const hi = Math.max(...(inputs.batch_size_max[i] || []).filter(Number.isFinite));
    const lo = Math.min(...(inputs.batch_size_min[i] || []).filter(Number.isFinite));
    return ratio(hi, lo);
  });
}

export function createImbalanceChart(target, { inputs, zoom, width }) {
  const { steps, imbalance, downsampled } = inputs;
  const bound = downsampled ? bucketBound(inputs) : null;
  const cap = imbalanceCap(bound ? imbalance.concat(bound) : imbalance);
  const capped = (values) => values.map((v) => (v === Infinity ? cap : Number.isFinite(v) ? v : null));
  const line = capped(imbalance);
  const empty = imbalance.map((v) => (v === Infinity ? cap : null));

  return mountStepChart(target, {
    zoom,
    width,
    height: HEIGHT,
    yScale: { range: () => [Math.max(0, 1 - (cap - 1) * 0.08), cap + (cap - 1) * 0.08] },
    yAxis: valueAxis('max / min', { values: (u, ticks) => ticks.map((t) => (t >= cap ? '∞' : fmt(t, 2))) }),
    series: [
      {
        label: 'imbalance',
        stroke: '#1976d2',
        width: 1.5,
        paths: steppedOrDense(),
        points: { show: false },
        value: (u, v, si, idx) => (idx == null ? '–' : fmt(imbalance[idx])),
      },
      ...(bound
        ? [
            {
              label: 'bucket upper bound',
              stroke: '#90caf9',
              dash: [4, 3],
              width: 1,
              paths: steppedOrDense(),
              points: { show: false },
              value: (u, v, si, idx) => (idx == null ? '–' : fmt(bound[idx])),
            },
          ]
        : []),
      {
        label: `empty replica (∞, drawn at ${cap})`,
        stroke: EMPTY_COLOR,
        fill: EMPTY_COLOR,
        width: 0,
        paths: () => null,
        points: { show: true, size: 7, fill: EMPTY_COLOR, stroke: EMPTY_COLOR },
        value: (u, v) => (v == null ? '–' : 'yes'),
      },
    ],
    hooks: {
      // A dashed line at the cap, labelled, so "∞" reads as a ceiling and not a value.
      drawAxes: [
        (u) => {
          const { ctx } = u;
          const y = Math.round(u.valToPos(cap, 'y', true));
          ctx.save();
          ctx.strokeStyle = EMPTY_COLOR;
          ctx.globalAlpha = 0.6;
          ctx.setLineDash([4, 4]);
          ctx.lineWidth = 1;
          ctx.beginPath();
          ctx.moveTo(u.bbox.left, y);
          ctx.lineTo(u.bbox.left + u.bbox.width, y);
          ctx.stroke();
          ctx.restore();
        },
      ],
    },
  }, bound ? [steps, line, capped(bound), empty] : [steps, line, empty]);
}
