// Step × replica heatmap of batch sizes, drawn by hand on a <canvas>.
// Each pixel column shows the smallest batch of the steps it covers, so a single
// short or empty step stays visible at any zoom.
import { h, fmt } from '../dom.js';
import { PLOT_LEFT as GUTTER_LEFT, PLOT_RIGHT } from './uplot_common.js';
import { scaleRgb, rgbCss, scaleGradient, EMPTY_RGB, MISSING_RGB } from '../colors.js';
import { replicaColumns } from './match_matrix.js';
import { replicaName, replicasName } from '../names.js';

const GUTTER_BOTTOM = 20;
const FONT = '11px Roboto, sans-serif';

const pack = ([r, g, b]) => ((255 << 24) | (b << 16) | (g << 8) | r) >>> 0;

/** Index of the last element of sorted `a` that is <= v (0 if none). */
function floorIndex(a, v) {
  let lo = 0;
  let hi = a.length - 1;
  while (lo < hi) {
    const mid = (lo + hi + 1) >> 1;
    if (a[mid] <= v) lo = mid;
    else hi = mid - 1;
  }
  return lo;
}

/** Whole-number ticks in [lo, hi) at a 1-2-5 increment, at most about `max` of them. */
function niceTicks(lo, hi, max) {
  const raw = Math.max(1, (hi - lo) / max);
  const mag = 10 ** Math.floor(Math.log10(raw));
  const inc = [1, 2, 5, 10].map((m) => m * mag).find((x) => x >= raw);
  const out = [];
  for (let v = Math.ceil(lo / inc) * inc; v < hi; v += inc) out.push(v);
  return out;
}

export function createHeatmap(target, { inputs, zoom, width, lastStep, deviceName, workerOf = () => null }) {
  const { steps, downsampled } = inputs;
  const rows = replicaColumns(inputs, workerOf); // each replica, or each block of replicas
  const n = steps.length;
  const R = rows.length;
  const src = downsampled ? inputs.batch_size_min : inputs.batch_size;

  // Values step-major in a typed array (NaN = no value), and the top of the scale.
  const vals = new Float32Array(n * R);
  let top = 0;
  for (let i = 0; i < n; i++) {
    const row = src[i] || [];
    for (let r = 0; r < R; r++) {
      const v = row[r];
      const x = typeof v === 'number' && Number.isFinite(v) ? v : NaN;
      vals[i * R + r] = x;
      if (x > top) top = x;
    }
  }
  // Color lookup: 256 steps of the sequential scale, plus empty and missing.
  const LUT = new Uint32Array(256);
  for (let k = 0; k < 256; k++) LUT[k] = pack(scaleRgb(0.08 + 0.92 * (k / 255)));
  const EMPTY = pack(EMPTY_RGB);
  const MISSING = pack(MISSING_RGB);
  const color = (v) => (!(v === v) || v === Infinity ? MISSING : v <= 0 ? EMPTY : LUT[Math.round((v / top) * 255)]);

  const rowH = Math.max(3, Math.min(18, Math.floor(384 / Math.max(1, R))));
  const plotH = R * rowH;
  const height = plotH + GUTTER_BOTTOM;
  const stepEnd = (i) => (i + 1 < n ? steps[i + 1] - 1 : Math.max(steps[i], lastStep ?? steps[i]));

  const canvas = h('canvas', { class: 'heatmap-canvas' });
  const selection = h('div', { class: 'heatmap-selection', hidden: true });
  const tooltip = h('div', { class: 'chart-tooltip', hidden: true });
  const wrap = h('div', { class: 'heatmap-wrap' }, [canvas, selection, tooltip]);
  const legend = h('div', { class: 'heatmap-legend' }, [
    h('span', {}, 'examples per replica'),
    h('span', { class: 'swatch', style: { background: rgbCss(EMPTY_RGB) } }),
    h('span', {}, '0 (empty)'),
    h('span', {}, fmt(top > 0 ? Math.min(1, top) : 0)),
    h('span', { class: 'gradient', style: { background: scaleGradient() } }),
    h('span', {}, fmt(top)),
    h('span', { class: 'swatch', style: { background: rgbCss(MISSING_RGB) } }),
    h('span', {}, 'no data'),
    downsampled ? h('span', { class: 'muted' }, '(smallest batch of each bucket)') : null,
  ]);
  target.append(wrap, legend);

  const off = document.createElement('canvas');
  let cssW = width;
  let i0 = 0; // first and last visible bucket
  let i1 = Math.max(0, n - 1);
  let cols = []; // per pixel column: [first bucket, last bucket]

  /** Shows the buckets that meet the step range [min, max). */
  function setRange(min, max) {
    if (n === 0) return;
    i0 = floorIndex(steps, min);
    i1 = floorIndex(steps, max);
    if (i1 > i0 && steps[i1] >= max) i1--;
    draw();
  }

  function draw() {
    const dpr = window.devicePixelRatio || 1;
    canvas.width = Math.round(cssW * dpr);
    canvas.height = Math.round(height * dpr);
    canvas.style.width = `${cssW}px`;
    canvas.style.height = `${height}px`;
    const ctx = canvas.getContext('2d');
    ctx.setTransform(dpr, 0, 0, dpr, 0, 0);
    ctx.clearRect(0, 0, cssW, height);
    const W = Math.max(1, Math.floor(cssW - GUTTER_LEFT - PLOT_RIGHT));
    if (n === 0 || R === 0) return;

    // One image pixel per (column, replica), each column the minimum over its buckets.
    const span = i1 - i0 + 1;
    off.width = W;
    off.height = R;
    const octx = off.getContext('2d');
    const img = octx.createImageData(W, R);
    const px = new Uint32Array(img.data.buffer);
    const mins = new Float32Array(R);
    cols = new Array(W);
    for (let c = 0; c < W; c++) {
      const a = i0 + Math.floor((c * span) / W);
      const b = Math.max(a, i0 + Math.floor(((c + 1) * span) / W) - 1);
      cols[c] = [a, b];
      mins.fill(Infinity);
      for (let i = a; i <= b; i++) {
        const base = i * R;
        for (let r = 0; r < R; r++) {
          const v = vals[base + r];
          if (v < mins[r]) mins[r] = v;
        }
      }
      for (let r = 0; r < R; r++) px[r * W + c] = color(mins[r]);
    }
    octx.putImageData(img, 0, 0);
    ctx.imageSmoothingEnabled = false;
    ctx.drawImage(off, 0, 0, W, R, GUTTER_LEFT, 0, W, plotH);

    // Replica labels (every 1, 2, 4, … rows, as many as fit) and step ticks.
    ctx.font = FONT;
    ctx.fillStyle = '#616161';
    ctx.textBaseline = 'middle';
    ctx.textAlign = 'right';
    const every = 2 ** Math.ceil(Math.log2(Math.max(1, 13 / rowH)));
    for (let r = 0; r < R; r += every) {
      const y = Math.min(plotH - 6, Math.max(6, r * rowH + rowH / 2));
      const { replica, short } = rows[r];
      const worker = replica == null ? null : workerOf(replica);
      // A job's rows are grouped by worker: "w1 r3" is replica 3 on worker_1.
      const text = replica == null ? replicasName(short) : worker ? `${worker.replace(/^worker_/, 'w')} r${replica}` : replicaName(replica);
      ctx.fillText(text, GUTTER_LEFT - 6, y);
    }
    ctx.textBaseline = 'top';
    const s0 = steps[i0];
    const s1 = stepEnd(i1) + 1;
    const xOf = (v) => {
      const b = floorIndex(steps, v);
      const frac = (v - steps[b]) / Math.max(1, stepEnd(b) + 1 - steps[b]);
      return ((b - i0 + Math.min(1, frac)) * W) / span;
    };
    for (const v of niceTicks(s0, s1, Math.max(2, Math.floor(W / 90)))) {
      const x = xOf(v);
      ctx.textAlign = x < 16 ? 'left' : x > W - 16 ? 'right' : 'center';
      ctx.fillRect(GUTTER_LEFT + x, plotH, 1, 3);
      ctx.fillText(String(v), GUTTER_LEFT + x, plotH + 5);
    }
  }

  // Hover: step range, replica and value under the pointer.
  function cellAt(e) {
    const rect = canvas.getBoundingClientRect();
    const x = Math.floor(e.clientX - rect.left - GUTTER_LEFT);
    const y = e.clientY - rect.top;
    if (x < 0 || x >= cols.length || y < 0 || y >= plotH) return null;
    return { x, y, c: cols[x], r: Math.floor(y / rowH) };
  }
  canvas.addEventListener('mousemove', (e) => {
    const cell = cellAt(e);
    if (drag) updateSelection(e);
    if (!cell || drag) {
      tooltip.hidden = true;
      return;
    }
    const [a, b] = cell.c;
    const { r } = cell;
    let lo = Infinity;
    let hi = -Infinity;
    for (let i = a; i <= b; i++) {
      const l = inputs.batch_size_min[i]?.[r];
      const u = inputs.batch_size_max[i]?.[r];
      if (l < lo) lo = l;
      if (u > hi) hi = u;
    }
    const first = steps[a];
    const last = stepEnd(b);
    const value = lo === Infinity ? '—' : lo === hi ? fmt(lo) : `${fmt(lo)}–${fmt(hi)}`;
    tooltip.replaceChildren(
      h('div', { class: 'tt-title' }, first === last ? `step ${first}` : `steps ${first}–${last}`),
      h('div', {}, inputs.pooled ? rows[r].label : `${replicaName(rows[r].replica)}${deviceName(r) ? ` (${deviceName(r)})` : ''}`),
      h('div', {}, [h('b', {}, 'batch size: '), value]),
    );
    tooltip.hidden = false;
    const flip = cell.x > cols.length / 2;
    tooltip.style.left = flip ? '' : `${GUTTER_LEFT + cell.x + 12}px`;
    tooltip.style.right = flip ? `${cssW - GUTTER_LEFT - cell.x + 12}px` : '';
    tooltip.style.top = `${Math.min(cell.y + 8, Math.max(0, plotH - 40))}px`;
  });
  canvas.addEventListener('mouseleave', () => (tooltip.hidden = true));

  // Drag to zoom (shared with the charts), double-click to reset.
  let drag = null;
  canvas.addEventListener('mousedown', (e) => {
    const cell = cellAt(e);
    if (cell) drag = { from: cell.x, to: cell.x };
  });
  function updateSelection(e) {
    const rect = canvas.getBoundingClientRect();
    drag.to = Math.max(0, Math.min(cols.length - 1, Math.floor(e.clientX - rect.left - GUTTER_LEFT)));
    const a = Math.min(drag.from, drag.to);
    Object.assign(selection.style, { left: `${GUTTER_LEFT + a}px`, width: `${Math.abs(drag.to - drag.from)}px`, height: `${plotH}px` });
    selection.hidden = false;
  }
  const endDrag = () => {
    if (!drag) return;
    const a = Math.min(drag.from, drag.to);
    const b = Math.max(drag.from, drag.to);
    drag = null;
    selection.hidden = true;
    if (b - a >= 3) zoom.set(steps[cols[a][0]], stepEnd(cols[b][1]) + 1);
  };
  window.addEventListener('mouseup', endDrag);
  canvas.addEventListener('dblclick', () => zoom.reset());

  const unfollow = zoom.subscribe(setRange);
  setRange(...zoom.get());

  return {
    resize(w) {
      cssW = w;
      draw();
    },
    destroy() {
      unfollow();
      window.removeEventListener('mouseup', endDrag);
    },
  };
}
