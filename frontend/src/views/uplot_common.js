// Shared uPlot settings: TensorBoard-like axes, and wiring to the shared zoom.
import uPlot from 'uplot';

export { uPlot };

const FONT = '11px Roboto, sans-serif';
const GRID = { stroke: '#eee', width: 1 };
const TICKS = { stroke: '#ccc', width: 1, size: 4 };

export function axis(label, extra = {}) {
  return { label, font: FONT, labelFont: FONT, labelSize: 18, stroke: '#616161', grid: GRID, ticks: TICKS, ...extra };
}

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

/** Range of data for the x scale, widened when there is a single step. */
export function xRange(u, min, max) {
  if (min == null || max == null) return [0, 1];
  return min === max ? [min - 1, max + 1] : [min, max];
}
