// A replica × replica match matrix: one cell per pair, shaded by a share in [0, 1].
import { h } from '../dom.js';
import { replicaName, replicasName } from '../names.js';

/** "replica 3 · worker_1" for a replica of a multi-worker job, "replica 3" otherwise. */
export function replicaText(id, workerOf) {
  const worker = workerOf?.(id);
  return worker ? `${replicaName(id)} · ${worker}` : replicaName(id);
}

/**
 * Replicas `first`..`last` (positions in `replicas`) as one label: "replica 3", "replicas 0–31",
 * with their workers in a job ("replicas 0–31 · worker_0–worker_3").
 */
export function spanText(replicas, first, last, workerOf) {
  if (first === last) return replicaText(replicas[first], workerOf);
  const [a, b] = [workerOf?.(replicas[first]), workerOf?.(replicas[last])];
  const workers = a && b ? ` · ${a === b ? a : `${a}–${b}`}` : '';
  return `${replicasName(`${replicas[first]}–${replicas[last]}`)}${workers}`;
}

/**
 * The columns of a body's per-replica values (`replicas`, and `pooled.blocks` when it came cut to
 * blocks of replicas): `{label, short, replica, count}` each, `replica` the id of a column of one
 * replica (null for a block), `count` its replicas.
 */
export function replicaColumns(body, workerOf = () => null) {
  const ids = body.replicas;
  const spans = body.pooled ? body.pooled.blocks : ids.map((_, r) => [r, r]);
  return spans.map(([first, last]) => ({
    label: spanText(ids, first, last, workerOf),
    short: first === last ? String(ids[first]) : `${ids[first]}–${ids[last]}`,
    replica: first === last ? ids[first] : null,
    count: last - first + 1,
  }));
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

/** Beyond this many replicas the matrix is a canvas: a table of R² cells takes a page minutes. */
export const TABLE_REPLICAS = 64;
/** The canvas's side in CSS pixels at most; each pixel shows the largest share it covers. The
 * run view asks /rng and /data for matrices of more replicas cut to this many blocks. */
export const CANVAS_SIDE = 640;

/** A share's red and its opacity, shared by the table's cells and the canvas's pixels. */
const MATCH_RGB = [229, 57, 53];
const matchAlpha = (share) => 0.12 + 0.68 * Math.max(0, Math.min(1, share));

/** An "r,g,b" share colour: the table's red over white, white for 0, grey on the diagonal. */
function shareRgb(share, self) {
  if (self) return [238, 238, 238];
  if (!(share > 0)) return [255, 255, 255];
  const a = matchAlpha(share);
  return MATCH_RGB.map((c) => Math.round(255 + (c - 255) * a));
}

/**
 * The match matrix of many replicas on a canvas: image pixel (i, j) shows the largest share of
 * the replica pairs it covers (so one matching pair stays visible), the tooltip names that pair.
 * With `pooled` ({side, pairs_above_0}: the route cut the matrix to blocks) each pixel is a
 * block's largest share and the tooltip names the blocks' replicas. The canvas carries
 * data-replicas, data-matches (ordered pairs r ≠ q with a share above 0) and data-blocks.
 */
function createMatchCanvas({ replicas, matrix, cellText, title, workerOf, pooled }) {
  const R = replicas.length;
  const P = pooled ? matrix.length : Math.min(R, CANVAS_SIDE);
  const scale = Math.max(1, Math.floor(CANVAS_SIDE / R));
  const best = new Float32Array(P * P).fill(-1);
  const pair = new Int32Array(P * P * 2);
  let matches = 0;
  if (pooled) {
    // Blocks from the server (`pooled`): block i holds replicas r with floor(r * P / R) = i; a
    // cell is the largest share over its pairs r ≠ q, -1 for a diagonal block of one replica.
    matches = 2 * pooled.pairs_above_0;
    for (let i = 0; i < P; i++) {
      for (let j = 0; j < P; j++) {
        const share = Number(matrix[i]?.[j] ?? 0);
        const k = i * P + j;
        best[k] = share < 0 ? 0 : share;
        pair[2 * k] = i;
        pair[2 * k + 1] = share < 0 ? i : -1 - j; // -1 - j: block j (not a replica)
      }
    }
  } else {
    for (let r = 0; r < R; r++) {
      const row = matrix[r] || [];
      const i = Math.floor((r * P) / R);
      for (let q = 0; q < R; q++) {
        const share = r === q ? 0 : Number(row[q] ?? 0);
        if (r !== q && share > 0) matches++;
        const k = i * P + Math.floor((q * P) / R);
        if (share > best[k] || (best[k] < 0 && r === q)) {
          best[k] = share;
          pair[2 * k] = r;
          pair[2 * k + 1] = q;
        }
      }
    }
  }
  // The replicas of block i (floor(r * P / R) = i): first and last.
  const blockText = (i) => {
    const first = Math.ceil((i * R) / P);
    const last = Math.ceil(((i + 1) * R) / P) - 1;
    return spanText(replicas, first, last, workerOf);
  };
  const canvas = h('canvas', { class: 'match-canvas', dataset: { replicas: R, matches, blocks: pooled ? P : '' } });
  canvas.width = P;
  canvas.height = P;
  canvas.style.width = `${P * scale}px`;
  canvas.style.height = `${P * scale}px`;
  const ctx = canvas.getContext('2d');
  const img = ctx.createImageData(P, P);
  for (let k = 0; k < P * P; k++) {
    const [red, green, blue] = shareRgb(best[k], best[k] <= 0 && pair[2 * k] === pair[2 * k + 1]);
    img.data.set([red, green, blue, 255], 4 * k);
  }
  ctx.putImageData(img, 0, 0);
  const tooltip = h('div', { class: 'chart-tooltip', hidden: true });
  canvas.addEventListener('mousemove', (event) => {
    // The pointer in the canvas's content box (its border left out), in blocks.
    const box = canvas.getBoundingClientRect();
    const at = (offset, size) => Math.max(0, Math.min(P - 1, Math.floor((offset / size) * P)));
    const i = at(event.clientY - box.top - canvas.clientTop, canvas.clientHeight);
    const j = at(event.clientX - box.left - canvas.clientLeft, canvas.clientWidth);
    const [r, q] = [pair[2 * (i * P + j)], pair[2 * (i * P + j) + 1]];
    if (q < 0) tooltip.textContent = `${blockText(i)} and ${blockText(-1 - q)}: up to ${cellText(i, j)}`;
    else if (pooled) tooltip.textContent = blockText(i);
    else tooltip.textContent = r === q ? replicaText(replicas[r], workerOf) : `${replicaText(replicas[r], workerOf)} and ${replicaText(replicas[q], workerOf)}: ${cellText(r, q)}`;
    tooltip.style.left = `${event.clientX - box.left + 12}px`;
    tooltip.style.top = `${event.clientY - box.top + 12}px`;
    tooltip.hidden = false;
  });
  canvas.addEventListener('mouseleave', () => {
    tooltip.hidden = true;
  });
  const covers = pooled ? `each pixel the largest share of a block of about ${Math.round(R / P)} × ${Math.round(R / P)} pairs` : 'each pixel the largest share of the pairs it covers';
  const caption = `${title ?? ''} (${R} replicas: ${matches ? `${matches / 2} pairs above 0` : 'no pair above 0'}; ${covers})`;
  return h('figure', { class: 'match-matrix-canvas' }, [h('figcaption', {}, caption), h('div', { class: 'heatmap-wrap' }, [canvas, tooltip])]);
}

/**
 * matrix[r][q] in [0, 1]; cellText(r, q) gives the text of a cell. The diagonal is drawn
 * muted (a replica always matches itself). Cells carry data-r, data-q and data-share. For a
 * multi-worker job (`workerOf(id)` names a replica's worker) a worker row groups the columns,
 * rows say their worker and cells of two different workers get the class `cross-worker`.
 * Beyond TABLE_REPLICAS replicas, or with `pooled` (matrix[i][j] then a block's largest share,
 * as /rng and /data send it with matrix_side), it is a canvas (createMatchCanvas).
 */
export function createMatchMatrix({ replicas, matrix, cellText, title, deviceName, workerOf = () => null, pooled = null }) {
  if (pooled || replicas.length > TABLE_REPLICAS) return createMatchCanvas({ replicas, matrix, cellText, title, workerOf, pooled });
  const label = (r) => (deviceName?.(r) ? `${replicaText(replicas[r], workerOf)} (${deviceName(r)})` : replicaText(replicas[r], workerOf));
  const head = h('tr', {}, [h('th', {}, ''), ...replicas.map((_, q) => h('th', { scope: 'col' }, `${replicas[q]}`))]);
  const rows = replicas.map((_, r) =>
    h('tr', { dataset: workerOf(replicas[r]) ? { worker: workerOf(replicas[r]) } : {} }, [
      h('th', { scope: 'row', title: label(r) }, replicaText(replicas[r], workerOf)),
      ...replicas.map((_, q) => {
        const share = Number(matrix[r]?.[q] ?? 0);
        if (r === q) return h('td', { class: 'self', dataset: { r, q, share } }, '—');
        const cross = workerOf(replicas[r]) !== workerOf(replicas[q]);
        return h(
          'td',
          {
            class: [share > 0 ? 'match' : 'no-match', cross ? 'cross-worker' : null].filter(Boolean).join(' '),
            dataset: { r, q, share },
            style: { background: share > 0 ? `rgba(${MATCH_RGB.join(', ')}, ${matchAlpha(share)})` : '' },
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
