// A shared step range: the charts and the heatmap follow each other's zoom.

export function createZoom(full) {
  let range = full;
  const subscribers = new Set();
  const same = (a, b) => Math.abs(a - b) <= 1e-9 * Math.max(1, Math.abs(full[1] - full[0]));
  return {
    full,
    get: () => range,
    /** Sets the range and tells every subscriber except `from`. */
    set(min, max, from) {
      if (!Number.isFinite(min) || !Number.isFinite(max)) return;
      if (same(min, range[0]) && same(max, range[1])) return;
      range = [min, max];
      for (const fn of subscribers) if (fn !== from) fn(min, max);
    },
    reset() {
      this.set(full[0], full[1]);
    },
    subscribe(fn) {
      subscribers.add(fn);
      return () => subscribers.delete(fn);
    },
  };
}
