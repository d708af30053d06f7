// Colors: one distinct color per replica (works up to 64 and beyond), and the heatmap scale.

const BASE = [
  '#1976d2', '#ef6c00', '#388e3c', '#d32f2f', '#7b1fa2',
  '#00838f', '#c2185b', '#5d4037', '#689f38', '#455a64',
];

/** Color of the replica at position i: a fixed palette, then golden-angle hues. */
export function replicaColor(i) {
  if (i < BASE.length) return BASE[i];
  const hue = Math.round((i * 137.508 + 20) % 360);
  const light = [42, 32, 54][i % 3];
  const sat = [70, 60, 80][Math.floor(i / 3) % 3];
  return `hsl(${hue}, ${sat}%, ${light}%)`;
}

// Sequential scale (light to dark, viridis-like), as RGB stops.
const STOPS = [
  [253, 231, 37], [94, 201, 98], [33, 145, 140], [59, 82, 139], [68, 1, 84],
];
export const EMPTY_RGB = [229, 57, 53]; // batch size 0: an empty replica
export const MISSING_RGB = [224, 224, 224]; // no value

/** RGB of t in [0, 1] on the sequential scale. */
export function scaleRgb(t) {
  const x = Math.min(1, Math.max(0, t)) * (STOPS.length - 1);
  const i = Math.min(STOPS.length - 2, Math.floor(x));
  const f = x - i;
  const a = STOPS[i];
  const b = STOPS[i + 1];
  return [0, 1, 2].map((k) => Math.round(a[k] + (b[k] - a[k]) * f));
}

export const rgbCss = ([r, g, b]) => `rgb(${r}, ${g}, ${b})`;

/** CSS linear-gradient of the sequential scale, for legends. */
export const scaleGradient = () =>
  `linear-gradient(to right, ${STOPS.map((s, i) => `${rgbCss(s)} ${(100 * i) / (STOPS.length - 1)}%`).join(', ')})`;
