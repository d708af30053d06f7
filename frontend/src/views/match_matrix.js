// A replica × replica match matrix: one cell per pair, shaded by a share in [0, 1].
import { h } from '../dom.js';

/** "replica 3 · worker_1" for a replica of a multi-worker job, "replica 3" otherwise. */
export function replicaText(id, workerOf) {
  const worker = workerOf?.(id);
  return worker ? `replica ${id} · ${worker}` : `replica ${id}`;
}

/** A header row naming each worker over its (consecutive) replicas' columns, or null. */
function workerRow(replicas, workerOf) {
  const groups = [];
  for (const id of replicas) {
    const name = workerOf?.(id) ?? null;
    if (groups.length && groups[groups.length - 1].name === name) groups[groups.length - 1].span += 1;
    else groups.push({ name, span: 1 });
  }
  if (!groups.some((g) => g.name)) return null;
  return h('tr', { class: 'worker-row' }, [
    h('th', {}, 'worker'),
    ...groups.map((g) => h('th', { colspan: g.span, dataset: g.name ? { worker: g.name } : {} }, g.name ?? '')),
  ]);
}

/**
 * matrix[r][q] in [0, 1]; cellText(r, q) gives the text of a cell. The diagonal is drawn
 * muted (a replica always matches itself). Cells carry data-r, data-q and data-share. For a
 * multi-worker job (`workerOf(id)` names a replica's worker) a worker row groups the columns,
 * rows say their worker and cells of two different workers get the class `cross-worker`.
 */
export function createMatchMatrix({ replicas, matrix, cellText, title, deviceName, workerOf = () => null }) {
  const label = (r) => (deviceName?.(r) ? `${replicaText(replicas[r], workerOf)} (${deviceName(r)})` : replicaText(replicas[r], workerOf));
  const head = h('tr', {}, [h('th', {}, ''), ...replicas.map((_, q) => h('th', { scope: 'col' }, `${replicas[q]}`))]);
  const rows = replicas.map((_, r) =>
    h('tr', { dataset: workerOf(replicas[r]) ? { worker: workerOf(replicas[r]) } : {} }, [
      h('th', { scope: 'row', title: label(r) }, replicaText(replicas[r], workerOf)),
      ...replicas.map((_, q) => {
        const share = Number(matrix[r]?.[q] ?? 0);
        if (r === q) return h('td', { class: 'self', dataset: { r, q, share } }, '—');
        const alpha = Math.max(0, Math.min(1, share));
        const cross = workerOf(replicas[r]) !== workerOf(replicas[q]);
        return h(
          'td',
          {
            class: [share > 0 ? 'match' : 'no-match', cross ? 'cross-worker' : null].filter(Boolean).join(' '),
            dataset: { r, q, share },
            style: { background: share > 0 ? `rgba(229, 57, 53, ${0.12 + 0.68 * alpha})` : '' },
            title: `${replicaText(replicas[r], workerOf)} and ${replicaText(replicas[q], workerOf)}: ${cellText(r, q)}`,
          },
          cellText(r, q),
        );
      }),
    ]),
  );
  const workers = workerRow(replicas, workerOf);
  return h('table', { class: 'match-matrix' }, [title ? h('caption', {}, title) : null, h('thead', {}, [workers, head]), h('tbody', {}, rows)]);
}
