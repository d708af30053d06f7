// Gradient health per replica: local gradient norms (and each replica's ratio to the median of
// the others), loss per replica, a layer × replica heatmap at a chosen step, and NaN/Inf markers.
import { h, fmt } from '../dom.js';
import { replicaColor, scaleRgb, rgbCss, scaleGradient } from '../colors.js';
import { replicaColumns, replicaText } from './match_matrix.js';
import { valueAxis, mountStepChart } from './uplot_common.js';
import { replicaName } from '../names.js';

const HEIGHT = 220;
const NAN_COLOR = '#e53935';
const ZERO_RGB = [238, 238, 238];
const positive = (v) => (typeof v === 'number' && Number.isFinite(v) && v > 0 ? v : null);
const finite = (v) => (typeof v === 'number' && Number.isFinite(v) ? v : null);
/** A ratio for display: whole numbers from 100 up, 2 decimals below. */
const ratioText = (v) => (Number.isFinite(v) && Math.abs(v) >= 100 ? Math.round(v).toLocaleString('en-US') : fmt(v, 2));

/** Replicas with a NaN/Inf in an event, e.g. "replica 1: 16 NaN, loss NaN". */
export function eventText(e, replicas, workerOf = () => null) {
  const parts = [];
  replicas.forEach((id, r) => {
    const bits = [];
    if (e.grad_nan[r]) bits.push(`${e.grad_nan[r]} NaN`);
    if (e.grad_inf[r]) bits.push(`${e.grad_inf[r]} Inf`);
    if (e.loss_nan[r]) bits.push('loss NaN');
    if (e.loss_inf[r]) bits.push('loss Inf');
    if (bits.length) parts.push(`${replicaText(id, workerOf)}: ${bits.join(', ')}`);
  });
  return parts.join('; ');
}

/**
 * The lines of the charts and the heatmap's columns: each replica, or each block of replicas when
 * the body came pooled (`{label, head(colW), replica}`: `replica` is the replica's id, null for a
 * block; a block's values are the largest of its replicas').
 */
export function gradientColumns(grads, workerOf = () => null) {
  return replicaColumns(grads, workerOf).map((c) => ({
    ...c,
    head: (colW) => (grads.pooled ? c.short : columnText(c.replica, colW, workerOf)),
  }));
}

/** A heatmap column header: "w1 r3" (replica 3 on worker_1) in a job, as wide as fits. */
function columnText(id, colW, workerOf) {
  const worker = workerOf?.(id);
  if (worker) return colW >= 60 ? `${worker.replace(/^worker_/, 'w')} r${id}` : String(id);
  return colW >= 60 ? replicaName(id) : String(id);
}

/** Draw hook: a red dashed vertical line at every step with a NaN/Inf event. */
function nanMarkers(events) {
  return (u) => {
    if (!events.length) return;
    const { ctx } = u;
    ctx.save();
    ctx.strokeStyle = NAN_COLOR;
    ctx.fillStyle = NAN_COLOR;
    ctx.setLineDash([3, 3]);
    ctx.lineWidth = 1.5;
    ctx.font = '10px Roboto, sans-serif';
    for (const e of events) {
      const x = Math.round(u.valToPos(e.step, 'x', true));
      if (x < u.bbox.left || x > u.bbox.left + u.bbox.width) continue;
      ctx.beginPath();
      ctx.moveTo(x, u.bbox.top);
      ctx.lineTo(x, u.bbox.top + u.bbox.height);
      ctx.stroke();
      ctx.fillText('NaN/Inf', x + 3, u.bbox.top + 10);
    }
    ctx.restore();
  };
}

function lineChart(target, { steps, columns, labels, yLabel, log, zoom, width, value, events, hline }) {
  return mountStepChart(target, {
    zoom,
    width,
    height: HEIGHT,
    yScale: log ? { distr: 3 } : { auto: true },
    yAxis: valueAxis(yLabel),
    series: labels.map((label, r) => ({
      label,
      stroke: replicaColor(r),
      width: 1.5,
      spanGaps: false,
      points: { show: steps.length <= 60, size: 4 },
      value: value(r),
    })),
    hooks: {
      draw: [
        nanMarkers(events),
        (u) => {
          if (hline == null) return;
          const y = Math.round(u.valToPos(hline, 'y', true));
          if (!(y >= u.bbox.top && y <= u.bbox.top + u.bbox.height)) return;
          const { ctx } = u;
          ctx.save();
          ctx.strokeStyle = '#fb8c00';
          ctx.setLineDash([5, 4]);
          ctx.beginPath();
          ctx.moveTo(u.bbox.left, y);
          ctx.lineTo(u.bbox.left + u.bbox.width, y);
          ctx.stroke();
          ctx.restore();
        },
      ],
    },
  }, [steps, ...columns]);
}

/** The layer × replica heatmap of gradient norms at one step (canvas). */
function layerHeatmap(target, { grads, width, threshold, workerOf }) {
  const { variables, layer_norms: norms, layer_ratio: ratio } = grads;
  const columns = gradientColumns(grads, workerOf);
  const V = variables.length;
  const R = columns.length;
  const labelW = Math.min(280, Math.max(120, Math.floor(width * 0.3)));
  const rowH = 20;
  const headH = 18;
  let lo = Infinity;
  let hi = -Infinity;
  for (const row of norms) for (const v of row) if (v > 0 && Number.isFinite(v)) (lo = Math.min(lo, v)), (hi = Math.max(hi, v));
  const span = hi > lo ? Math.log10(hi) - Math.log10(lo) : 1;
  const colorOf = (v) => {
    if (!Number.isFinite(v)) return [229, 57, 53];
    if (!(v > 0)) return ZERO_RGB;
    return scaleRgb(0.08 + 0.92 * ((Math.log10(v) - Math.log10(lo)) / span || 0));
  };
  const canvas = h('canvas', { class: 'layer-heatmap', dataset: { step: String(grads.layer_step ?? '') } });
  const tooltip = h('div', { class: 'chart-tooltip', hidden: true });
  const wrap = h('div', { class: 'heatmap-wrap' }, [canvas, tooltip]);
  const legend = h('div', { class: 'heatmap-legend' }, [
    h('span', {}, 'gradient norm (log scale)'),
    h('span', {}, Number.isFinite(lo) ? fmt(lo, 4) : '—'),
    h('span', { class: 'gradient', style: { background: scaleGradient() } }),
    h('span', {}, Number.isFinite(hi) ? fmt(hi, 4) : '—'),
    h('span', { class: 'swatch', style: { background: rgbCss(ZERO_RGB) } }),
    h('span', {}, '0'),
    h('span', { class: 'swatch', style: { background: NAN_COLOR } }),
    h('span', {}, 'NaN/Inf'),
    h('span', { class: 'swatch outlier-swatch' }),
    h('span', {}, `over ${fmt(threshold)}× the median of the other replicas`),
  ]);
  target.append(wrap, legend);
  let colW = 60;

  function draw(w) {
    colW = Math.max(14, Math.min(110, Math.floor((w - labelW - 8) / Math.max(1, R))));
    const cssW = labelW + colW * R + 4;
    const cssH = headH + rowH * V + 2;
    const dpr = window.devicePixelRatio || 1;
    canvas.width = Math.round(cssW * dpr);
    canvas.height = Math.round(cssH * dpr);
    canvas.style.width = `${cssW}px`;
    canvas.style.height = `${cssH}px`;
    const ctx = canvas.getContext('2d');
    ctx.setTransform(dpr, 0, 0, dpr, 0, 0);
    ctx.font = '11px Roboto, sans-serif';
    ctx.textBaseline = 'middle';
    ctx.fillStyle = '#616161';
    ctx.textAlign = 'center';
    if (colW >= 40 || R <= 16) columns.forEach((c, r) => ctx.fillText(c.head(colW), labelW + r * colW + colW / 2, headH / 2));
    for (let v = 0; v < V; v++) {
      const y = headH + v * rowH;
      ctx.fillStyle = '#424242';
      ctx.textAlign = 'right';
      let name = variables[v];
      while (name.length > 4 && ctx.measureText(name).width > labelW - 10) name = '…' + name.slice(2);
      ctx.fillText(name, labelW - 6, y + rowH / 2);
      for (let r = 0; r < R; r++) {
        const value = norms[v]?.[r];
        ctx.fillStyle = rgbCss(colorOf(value));
        ctx.fillRect(labelW + r * colW, y, colW - 1, rowH - 1);
        if (ratio[v]?.[r] > threshold && Number.isFinite(ratio[v][r])) {
          ctx.strokeStyle = NAN_COLOR;
          ctx.lineWidth = 2;
          ctx.strokeRect(labelW + r * colW + 1, y + 1, colW - 3, rowH - 3);
        }
      }
    }
  }

  canvas.addEventListener('mousemove', (e) => {
    const rect = canvas.getBoundingClientRect();
    const x = e.clientX - rect.left - labelW;
    const y = e.clientY - rect.top - headH;
    const r = Math.floor(x / colW);
    const v = Math.floor(y / rowH);
    if (x < 0 || y < 0 || r >= R || v >= V) {
      tooltip.hidden = true;
      return;
    }
    tooltip.replaceChildren(
      h('div', { class: 'tt-title' }, variables[v]),
      h('div', {}, `${columns[r].label} · step ${grads.layer_step}`),
      h('div', {}, [h('b', {}, 'norm: '), fmt(norms[v]?.[r], 4)]),
      h('div', {}, [h('b', {}, 'ratio to median of others: '), ratioText(ratio[v]?.[r])]),
    );
    tooltip.hidden = false;
    tooltip.style.left = `${Math.min(labelW + x + 12, rect.width - 200)}px`;
    tooltip.style.top = `${headH + y + 10}px`;
  });
  canvas.addEventListener('mouseleave', () => (tooltip.hidden = true));
  draw(width);
  return { resize: draw };
}

/** Largest finite ratio to the median: {replica position, step index, ratio}. */
export function peakRatio(grads) {
  let best = null;
  grads.ratio.forEach((row, i) =>
    row.forEach((v, r) => {
      if (Number.isFinite(v) && (!best || v > best.ratio)) best = { r, i, ratio: v };
    }),
  );
  return best;
}

/** The captured culprit batches of one NaN/Inf step: which examples hold NaN/Inf, a .npz link. */
export function batchCell(run, captured, workerOf = () => null) {
  if (!captured.length) return '–';
  return captured.map((b) => {
    const bad = b.inputs.filter((i) => i.nonfinite_examples.length);
    const what = bad.length
      ? bad.map((i) => `${i.name}: example${i.nonfinite_examples.length > 1 ? 's' : ''} ${i.nonfinite_examples.join(', ')}`).join('; ')
      : 'no NaN/Inf in the inputs (look at the labels, the model or the loss)';
    const cut = b.inputs.filter((i) => i.truncated).map((i) => `${i.name}: first ${i.kept_rows} of ${i.shape[0]} rows kept`);
    const href = `./gradients?run=${encodeURIComponent(run)}&batch_step=${b.step}&batch_replica=${b.replica}`;
    return h('div', { class: 'captured', dataset: { replica: String(b.replica), part: 'captured' } }, [
      `${replicaText(b.replica, workerOf)}: ${what}${cut.length ? ` (${cut.join('; ')})` : ''} `,
      h('a', { href, download: '', dataset: { part: 'batch-link' } }, 'batch .npz'),
    ]);
  });
}

export function createGradients(target, { grads, zoom, width, threshold, onStep, workerOf = () => null }) {
  const { steps, replicas, nonfinite: events } = grads;
  const columns = gradientColumns(grads, workerOf);
  const labels = columns.map((c) => c.label);
  const views = [];
  const what =
    grads.scaling === 'replica_loss'
      ? "Norm of the gradient of each replica's own loss, on its local batch, before the all-reduce (Keras's 1/replicas loss scaling and any loss scale undone)."
      : 'Norm of each replica\'s local gradients as given to the optimizer (or observe_gradients, divided by its scale), before the all-reduce.';
  const peak = peakRatio(grads);
  const summary = h('p', { class: 'grad-summary', dataset: { part: 'summary' } }, [
    what,
    ' ',
    peak
      ? h('span', { dataset: { peakReplica: String(columns[peak.r].replica ?? '') } }, `Largest ratio to the median of the other replicas: ${columns[peak.r].label}, ×${ratioText(peak.ratio)} at step ${steps[peak.i]}.`)
      : null,
    grads.pooled ? ` ${replicas.length} replicas in ${columns.length} blocks: each line and column the largest value of its replicas.` : null,
  ]);
  target.append(summary);

  if (!steps.length) {
    target.append(h('p', { class: 'muted' }, 'No logged gradient steps yet (NaN/Inf events are listed below).'));
  } else {
    const normBox = h('div', { class: 'chart', dataset: { part: 'norm' } });
    const ratioBox = h('div', { class: 'chart', dataset: { part: 'ratio' } });
    target.append(h('h3', {}, 'Local gradient norm per replica'), normBox);
    target.append(
      h('h3', {}, 'Ratio to the median of the other replicas'),
      h('p', { class: 'muted' }, `1 = like the others; the dashed orange line is the outlier threshold (${fmt(threshold)}×). Red dashed lines: steps with NaN/Inf.`),
      ratioBox,
    );
    const column = (m) => columns.map((_, r) => steps.map((_, i) => positive(m[i]?.[r])));
    views.push(
      lineChart(normBox, {
        steps,
        columns: column(grads.global_norm),
        labels,
        yLabel: grads.downsampled ? 'norm (bucket max)' : 'gradient norm',
        log: true,
        zoom,
        width,
        events,
        value: (r) => (u, v, si, idx) => (idx == null ? '–' : `${fmt(grads.global_norm[idx]?.[r], 4)} (×${ratioText(grads.ratio[idx]?.[r])})`),
      }),
      lineChart(ratioBox, {
        steps,
        columns: column(grads.ratio),
        labels,
        yLabel: 'ratio to median',
        log: true,
        zoom,
        width,
        events,
        hline: threshold,
        value: (r) => (u, v, si, idx) => (idx == null ? '–' : `×${ratioText(grads.ratio[idx]?.[r])}`),
      }),
    );
    if (grads.has_loss) {
      const lossBox = h('div', { class: 'chart', dataset: { part: 'loss' } });
      target.append(h('h3', {}, 'Loss per replica'), lossBox);
      views.push(
        lineChart(lossBox, {
          steps,
          columns: columns.map((_, r) => steps.map((_, i) => finite(grads.loss[i]?.[r]))),
          labels,
          yLabel: 'local loss',
          log: false,
          zoom,
          width,
          events,
          value: (r) => (u, v, si, idx) => (idx == null ? '–' : fmt(grads.loss[idx]?.[r], 4)),
        }),
      );
    }

    const select = h(
      'select',
      { id: 'layer-step', dataset: { part: 'layer-step' }, onchange: () => onStep(Number(select.value)) },
      steps.map((s) => h('option', { value: String(s), selected: s === grads.layer_step }, `step ${s}`)),
    );
    const layers = h('div', { dataset: { part: 'layers' } });
    target.append(
      h('h3', {}, ['Gradient norm per variable and replica at ', select]),
      h('p', { class: 'muted' }, 'Each row a variable, each column a replica; outlined: over the threshold times the median of the other replicas on that row. Hover for values.'),
      layers,
    );
    views.push(layerHeatmap(layers, { grads, width, threshold, workerOf }));
  }

  const batches = grads.batches ?? [];
  const rows = events.map((e) =>
    h('tr', { dataset: { step: String(e.step) } }, [
      h('td', {}, `step ${e.step}`),
      h('td', {}, eventText(e, replicas, workerOf)),
      h('td', {}, batchCell(grads.run, batches.filter((b) => b.step === e.step), workerOf)),
    ]),
  );
  target.append(
    h('h3', {}, 'NaN / Inf'),
    events.length
      ? h('table', { class: 'shapes nonfinite', dataset: { part: 'nonfinite' } }, [
          h('thead', {}, h('tr', {}, [h('th', {}, 'step'), h('th', {}, 'replicas with NaN/Inf (gradient values, loss)'), h('th', {}, 'captured batch')])),
          h('tbody', {}, rows),
        ])
      : h('p', { class: 'note ok', dataset: { part: 'nonfinite' } }, 'No NaN or Inf in any replica\'s gradients or loss (checked at every step).'),
  );

  return {
    resize: (w) => views.forEach((v) => v.resize?.(w)),
    destroy: () => views.forEach((v) => v.destroy?.()),
  };
}
