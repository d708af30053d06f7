// Parameter servers (ParameterServerStrategy): the variable bytes each ps holds, its share and its
// largest variable, from `/variables`' `parameter_servers`; a ps its `ps_imbalance` finding names
// is highlighted, and the run's `ps_imbalance` findings are listed under the table.
import { h, fmt } from '../dom.js';

/** Bytes as the report writes them: "250 KiB", "1.5 MiB", "64 B". */
export function bytesText(count) {
  for (const [unit, scale] of [['GiB', 2 ** 30], ['MiB', 2 ** 20], ['KiB', 2 ** 10]]) {
    if (count >= scale) return `${Number((count / scale).toPrecision(3))} ${unit}`;
  }
  return `${fmt(count)} B`;
}

const percent = (share) => `${(share * 100).toFixed(1)} %`;

export function createPsTable(target, { servers: held, findings }) {
  if (!held.servers.length) {
    target.append(h('p', { class: 'muted' }, 'No parameter server holds an observed variable.'));
    return {};
  }
  const imbalance = findings.filter((f) => f.kind === 'ps_imbalance');
  // A finding names its server's largest variable and share (the rule also asks 64 KiB in all).
  const flagged = (s) => imbalance.some((f) => f.name === s.largest && Math.abs(f.value - s.share) < 1e-3);
  const head = ['ps', 'device', 'bytes', 'share', 'variables', 'largest variable'];
  const rows = held.servers.map((s) => {
    const over = flagged(s);
    return h('tr', { class: over ? 'mismatch' : null, dataset: { ps: String(s.ps) } }, [
      h('th', { scope: 'row' }, `ps ${s.ps}`),
      h('td', {}, s.device),
      h('td', { class: 'num' }, bytesText(s.bytes)),
      h('td', { class: 'num' }, percent(s.share)),
      h('td', { class: 'num' }, String(s.variables)),
      h('td', {}, s.largest == null ? '—' : `${s.largest} (${bytesText(s.largest_bytes)})`),
    ]);
  });
  const off = held.off_ps_bytes ? `; ${bytesText(held.off_ps_bytes)} on no parameter server` : '';
  target.append(
    h('p', { class: 'muted', dataset: { part: 'ps-total' } }, `${bytesText(held.total_bytes)} on ${held.servers.length} parameter servers, fair share ${percent(held.fair_share)}${off}.`),
    h('div', { class: 'table-scroll' }, h('table', { class: 'shapes ps-table' }, [h('thead', {}, h('tr', {}, head.map((t) => h('th', {}, t)))), h('tbody', {}, rows)])),
  );
  target.append(
    h(
      'div',
      { class: 'notes', dataset: { part: 'ps-notes' } },
      imbalance.length
        ? imbalance.map((f) => h('p', { class: 'note', dataset: { severity: f.severity, kind: f.kind } }, f.message))
        : [h('p', { class: 'note ok' }, 'The parameter servers hold their share of the variable bytes.')],
    ),
  );
  return {};
}
