// Shared uPlot settings: TensorBoard-like axes, wiring to the shared zoom, and the mount of a step chart.
import uPlot from 'uplot';

export { uPlot };

const FONT = '11px Roboto, sans-serif';
const GRID = { stroke: '#eee', width: 1 };
const TICKS = { stroke: '#ccc', width: 1, size: 4 };

/** Plot area offsets shared by the charts and the heatmap, so their step axes line up. */
export const PLOT_LEFT = 80;
export const PLOT_RIGHT = 16;
const Y_AXIS_SIZE = PLOT_LEFT - 18 - 4;

/** Whole-number ticks for step axes. */
const STEP_INCRS = [1, 2, 5, 10, 20, 25, 50, 100, 200, 250, 500].flatMap((x) => [x, x * 1e3, x * 1e6]).sort((a, b) => a - b);

const axis = (label, extra = {}) => ({
  label, font: FONT, labelFont: FONT, labelSize: 18, stroke: '#616161', grid: GRID, ticks: TICKS, ...extra,
});

/** A y axis of fixed width, so every chart's plot area starts at PLOT_LEFT. */
export const valueAxis = (label, extra = {}) => axis(label, { size: Y_AXIS_SIZE, ...extra });

/** The x axis: steps, whole numbers only. */
export const stepAxis = () => axis('step', { incrs: STEP_INCRS });

/** Step series (x) shown in the legend as "step N". */
export const stepSeries = { label: 'step', value: (u, v) => (v == null ? '–' : `step ${v}`) };

/** Makes `u` follow and drive the shared zoom; returns the unsubscribe function. */
export function followZoom(u, zoom) {
  const apply = (min, max) => u.setScale('x', { min, max });
  u.hooks.setScale = u.hooks.setScale || [];
  u.hooks.setScale.push((self, key) => {
    if (key === 'x') zoom.set(self.scales.x.min, self.scales.x.max, apply);
  });
  const [min, max] = zoom.get();
  if (min !== zoom.full[0] || max !== zoom.full[1]) apply(min, max);
  return zoom.subscribe(apply);
}

/**
 * Stepped lines while there are fewer points than pixels; beyond that uPlot's linear builder,
 * which keeps each pixel column's min and max (so a single odd step stays visible) and is far
 * cheaper than 10k-step paths for every replica.
 */
export function steppedOrDense() {
  const stepped = uPlot.paths.stepped({ align: 1, extend: true });
  const linear = uPlot.paths.linear();
  return (u, si, i0, i1) => (i1 - i0 > u.bbox.width / 2 ? linear : stepped)(u, si, i0, i1);
}

/**
 * The x scale: the run's full range (last step included, [first, last + 1)) when uPlot
 * auto-ranges (first draw, double-click), else the range asked for.
 */
export function xRange(steps, full) {
  const first = steps[0];
  const last = steps[steps.length - 1];
  return (u, min, max) => {
    if (min == null || max == null || first === last || (min === first && max === last)) return [...full];
    return [min, max];
  };
}

/**
 * Mounts a step chart: uPlot in `target` over `data` (`[steps, ...columns]`), following the shared
 * zoom. What every step chart shares is set here: its size, the padding that lines plot areas up,
 * the x scale over the run's steps, the step axis and series, drag-to-zoom on x, the live legend.
 *
 * `chart` gives the rest: `zoom`, `width`, `height`; `yScale` (the y scale's options); `yAxis`
 * (a `valueAxis`); `series` (the series after the step series); `cursor` (merged into the
 * drag-to-zoom cursor); any other uPlot option (e.g. `hooks`) as it is.
 *
 * Returns the view object `{plot, resize(width), destroy()}`, `plot` the uPlot (for overlays).
 */
export function mountStepChart(target, chart, data) {
  const { zoom, width, height, yScale, yAxis, series, cursor, ...options } = chart;
  const opts = {
    width,
    height,
    padding: [8, PLOT_RIGHT, 0, 4],
    scales: { x: { time: false, range: xRange(data[0], zoom.full) }, y: yScale },
    axes: [stepAxis(), yAxis],
    series: [stepSeries, ...series],
    cursor: { drag: { x: true, y: false }, ...cursor },
    legend: { live: true },
    ...options,
  };
  const plot = new uPlot(opts, data, target);
  const unfollow = followZoom(plot, zoom);
  return {
    plot,
    resize: (w) => plot.setSize({ width: w, height }),
    destroy() {
      unfollow();
      plot.destroy();
    },
  };
}
