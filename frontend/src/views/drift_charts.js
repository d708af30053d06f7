// Weight drift: the most divergent variables over steps, and one variable replica by replica.
// Divergence is ||copy_r - copy_0|| / ||copy_0|| (relative L2): 0 means bit-identical copies.
import { h } from '../dom.js';
import { replicaColor } from '../colors.js';
import { replicaColumns } from './match_matrix.js';
import { valueAxis, mountStepChart } from './uplot_common.js';

const HEIGHT = 240;

/** 0, 1.23e-7, 0.0123, 1.23, ∞ or — for a divergence value. */
export function fmtDrift(v) {
  if (v == null || Number.isNaN(v)) return '—';
  if (v === Infinity) return '∞';
  if (v === 0) return '0';
  const a = Math.abs(v);
  return a < 1e-3 || a >= 1e4 ? v.toExponential(2).replace(/\.?0+e/, 'e') : String(Number(v.toPrecision(3)));
}

const drawable = (v) => (typeof v === 'number' && Number.isFinite(v) ? v : null);

/**
 * A log-like y scale that still shows 0 (asinh, linear below the tolerance), so bit-identical
 * copies sit on the axis and drift from 1e-7 to 10 stays readable.
 */
function driftScale(tolerance) {
  return { distr: 4, log: 10, asinh: Math.max(tolerance || 1e-9, 1e-12) / 10, range: (u, min, max) => [0, Math.max(max, (tolerance || 1e-6) * 10) * 2] };
}

/** Ticks at 0 and at powers of ten (every one, or every 2nd/3rd when there are many). */
export function driftSplits(u, axisIdx, min, max) {
  const lo = Math.floor(Math.log10(Math.max((u.scales.y.asinh || 1e-9) * 10, 1e-300)));
  const hi = Math.ceil(Math.log10(Math.max(max, 1e-300)));
  const every = Math.max(1, Math.ceil((hi - lo + 1) / 6));
  const ticks = [0];
  for (let e = hi; e >= lo; e -= every) if (Number(`1e${e}`) <= max) ticks.push(Number(`1e${e}`));
  return ticks.sort((a, b) => a - b);
}

function toleranceHook(tolerance) {
  return (u) => {
    if (!(tolerance > 0)) return;
    const y = u.valToPos(tolerance, 'y', true);
    const { ctx } = u;
    ctx.save();
    ctx.strokeStyle = '#e53935';
    ctx.setLineDash([4, 4]);
    ctx.lineWidth = 1;
    ctx.beginPath();
    ctx.moveTo(u.bbox.left, y);
    ctx.lineTo(u.bbox.left + u.bbox.width, y);
    ctx.stroke();
    ctx.restore();
  };
}

function chart(target, { steps, columns, labels, colors, zoom, width, tolerance, yLabel }) {
  return mountStepChart(target, {
    zoom,
    width,
    height: HEIGHT,
    yScale: driftScale(tolerance),
    yAxis: valueAxis(yLabel, { splits: driftSplits, filter: (u, splits) => splits, values: (u, ticks) => ticks.map(fmtDrift) }),
    series: labels.map((label, i) => ({
      label,
      stroke: colors[i],
      width: 1.5,
      points: { show: steps.length <= 60, size: 4 },
      value: (u, v, si, idx) => (idx == null ? '–' : fmtDrift(columns[i].raw[idx])),
    })),
    hooks: { draw: [toleranceHook(tolerance)] },
  }, [steps, ...columns.map((c) => c.drawn)]);
}

const column = (raw) => ({ raw, drawn: raw.map(drawable) });

/** Max over replicas of each top variable's divergence, one line per variable. */
export function createDriftChart(target, { variables, zoom, width }) {
  const top = variables.top;
  if (!variables.steps.length || !top.length) {
    target.append(h('p', { class: 'muted' }, 'No variables were recorded for this run.'));
    return {};
  }
  const allZero = top.every((t) => t.max_rel_l2.every((v) => v === 0));
  target.append(
    h('p', { class: ['note', allZero ? 'ok' : null], dataset: { drift: allZero ? 'none' : 'some' } },
      allZero
        ? `Every copy of every variable is bit-identical to replica 0's at every logged step (${variables.steps.length} steps).`
        : `Most divergent variables (worst replica at each step). Red dashed line: the tolerance ${fmtDrift(variables.tolerance)}.`),
  );
  const box = h('div', { class: 'chart' });
  target.append(box);
  return chart(box, {
    steps: variables.steps,
    columns: top.map((t) => column(t.max_rel_l2)),
    labels: top.map((t) => t.name),
    colors: top.map((_, i) => replicaColor(i)),
    zoom,
    width,
    tolerance: variables.tolerance,
    yLabel: 'relative L2 vs replica 0',
  });
}

/**
 * The lines of the per-replica chart: each replica but replica 0 (the reference), or each block
 * of replicas when the series came pooled (`{column, label}`; a block's value is its worst).
 */
export function deviationLines(variables, deviceName) {
  const lines = replicaColumns(variables).map(({ label }, column) => ({
    column,
    label: !variables.pooled && deviceName(column) ? `${label} (${deviceName(column)})` : label,
  }));
  return variables.pooled ? lines : lines.slice(1);
}

/** One variable (chosen among the top ones), one line per replica (per block of many). */
export function createDeviationChart(target, { variables, zoom, width, deviceName }) {
  const top = variables.top;
  if (!variables.steps.length || !top.length) {
    target.append(h('p', { class: 'muted' }, 'No variables were recorded for this run.'));
    return {};
  }
  const select = h('select', { id: 'deviation-variable' }, top.map((t, i) => h('option', { value: String(i) }, t.name)));
  const exactNote = (variables.exact_steps.length
    ? `Exact check at ${variables.exact_steps.length} of ${variables.steps.length} logged steps; elsewhere estimated from the fingerprints.`
    : 'Estimated from per-copy fingerprints (exact for variables of at most 64 elements).')
    + (variables.pooled ? ` ${variables.replicas.length} replicas in ${variables.pooled.blocks.length} blocks, each line the worst replica of its block.` : '');
  const box = h('div', { class: 'chart' });
  target.append(h('div', { class: 'run-picker' }, [h('label', { for: 'deviation-variable' }, 'Variable'), select, h('span', { class: 'muted' }, exactNote)]), box);
  let view = null;
  const show = (i) => {
    view?.destroy?.();
    box.replaceChildren();
    const t = top[i];
    const lines = deviationLines(variables, deviceName);
    box.dataset.variable = t.name;
    box.dataset.lines = String(lines.length);
    view = chart(box, {
      steps: variables.steps,
      columns: lines.map(({ column: c }) => column(t.rel_l2.map((row) => row?.[c] ?? null))),
      labels: lines.map(({ label }) => label),
      colors: lines.map(({ column: c }) => replicaColor(c)),
      zoom,
      width,
      tolerance: variables.tolerance,
      yLabel: 'relative L2 vs replica 0',
    });
  };
  select.addEventListener('change', () => show(Number(select.value)));
  show(0);
  return {
    resize: (w) => view?.resize?.(w),
    destroy: () => view?.destroy?.(),
  };
}
