// Batch size per replica over steps: uPlot, one stepped line per replica.
import { h, fmt, shortList } from '../dom.js';
import { replicaColor } from '../colors.js';
import { replicaColumns } from './match_matrix.js';
import { valueAxis, mountStepChart, steppedOrDense } from './uplot_common.js';
import { replicaNoun } from '../names.js';

const HEIGHT = 280;
const finiteOrNull = (v) => (typeof v === 'number' && Number.isFinite(v) ? v : null);

/**
 * Mounts the chart into `target`. When the data is downsampled each line shows the
 * smallest batch of its bucket, so a single short or empty step stays visible.
 */
export function createBatchChart(target, { inputs, zoom, width, workerOf = () => null }) {
  const { steps, downsampled } = inputs;
  const shown = downsampled ? inputs.batch_size_min : inputs.batch_size;
  const lines = replicaColumns(inputs, workerOf); // each replica, or each block of replicas
  const columns = lines.map((_, r) => steps.map((_, i) => finiteOrNull(shown[i]?.[r])));

  const value = (r) => (u, v, si, idx) => {
    if (idx == null) return '–';
    if (!downsampled) return fmt(v);
    const lo = inputs.batch_size_min[idx]?.[r];
    const hi = inputs.batch_size_max[idx]?.[r];
    return lo === hi ? fmt(lo) : `${fmt(lo)}–${fmt(hi)}`;
  };

  const tooltip = h('div', { class: 'chart-tooltip', hidden: true });
  const stepped = steppedOrDense();
  const chart = {
    zoom,
    width,
    height: HEIGHT,
    yScale: { range: (u, min, max) => [0, max > 0 ? max * 1.1 : 1] },
    yAxis: valueAxis(downsampled ? 'examples (bucket min)' : `examples per ${replicaNoun()}`),
    series: lines.map((line, r) => ({
      label: line.label,
      stroke: replicaColor(r),
      width: 1.25,
      paths: stepped,
      points: { show: false },
      value: value(r),
    })),
    cursor: { points: { show: lines.length <= 16 } },
    hooks: { setCursor: [(u) => showTooltip(u)] },
  };

  function showTooltip(u) {
    const { idx, left, top } = u.cursor;
    if (idx == null || left == null || left < 0) {
      tooltip.hidden = true;
      return;
    }
    // Group the visible replicas (or blocks) by batch size: "4 examples: 62 replicas".
    const groups = new Map();
    lines.forEach((line, r) => {
      if (!u.series[r + 1].show) return;
      const v = fmt(shown[idx]?.[r]);
      if (!groups.has(v)) groups.set(v, []);
      groups.get(v).push(line);
    });
    const count = (members) => members.reduce((sum, line) => sum + line.count, 0);
    const rows = [...groups].sort((a, b) => count(b[1]) - count(a[1]));
    tooltip.replaceChildren(
      h('div', { class: 'tt-title' }, `step ${steps[idx]}${downsampled ? ' (bucket)' : ''}`),
      ...rows.map(([v, members]) =>
        h('div', {}, [
          h('b', {}, `${v} ${downsampled ? 'min ' : ''}examples: `),
          members.length === 1 ? members[0].label : `${count(members)} replicas (${shortList(members.map((m) => m.short), 8)})`,
        ]),
      ),
    );
    tooltip.hidden = false;
    const flip = left > u.over.clientWidth / 2;
    tooltip.style.left = flip ? '' : `${left + 12}px`;
    tooltip.style.right = flip ? `${u.over.clientWidth - left + 12}px` : '';
    tooltip.style.top = `${Math.max(0, top - 10)}px`;
  }

  const view = mountStepChart(target, chart, [steps, ...columns]);
  view.plot.over.appendChild(tooltip);
  view.plot.over.addEventListener('mouseleave', () => (tooltip.hidden = true));
  return view;
}
