// A replica × replica match matrix: one cell per pair, shaded by a share in [0, 1].
import { h } from '../dom.js';

/**
 * matrix[r][q] in [0, 1]; cellText(r, q) gives the text of a cell. The diagonal is drawn
 * muted (a replica always matches itself). Cells carry data-r, data-q and data-share.
 */
export function createMatchMatrix({ replicas, matrix, cellText, title, deviceName }) {
  const label = (r) => (deviceName?.(r) ? `replica ${replicas[r]} (${deviceName(r)})` : `replica ${replicas[r]}`);
  const head = h('tr', {}, [h('th', {}, ''), ...replicas.map((_, q) => h('th', { scope: 'col' }, `${replicas[q]}`))]);
  const rows = replicas.map((_, r) =>
    h('tr', {}, [
      h('th', { scope: 'row', title: label(r) }, `replica ${replicas[r]}`),
      ...replicas.map((_, q) => {
        const share = Number(matrix[r]?.[q] ?? 0);
        if (r === q) return h('td', { class: 'self', dataset: { r, q, share } }, '—');
        const alpha = Math.max(0, Math.min(1, share));
        return h(
          'td',
          {
            class: share > 0 ? 'match' : 'no-match',
            dataset: { r, q, share },
            style: { background: share > 0 ? `rgba(229, 57, 53, ${0.12 + 0.68 * alpha})` : '' },
            title: `replicas ${replicas[r]} and ${replicas[q]}: ${cellText(r, q)}`,
          },
          cellText(r, q),
        );
      }),
    ]),
  );
  return h('table', { class: 'match-matrix' }, [title ? h('caption', {}, title) : null, h('thead', {}, head), h('tbody', {}, rows)]);
}
