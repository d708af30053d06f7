// Placement: every variable, the replica devices holding its copies, and its drift summary.
import { h } from '../dom.js';
import { fmtDrift } from './drift_charts.js';
import { replicaName } from '../names.js';
import { bytesText } from './ps_table.js';

const MAX_ROWS = 2000;

export function createPlacementTable(target, { variables, deviceName }) {
  const rows = variables.variables;
  if (!rows.length) {
    target.append(h('p', { class: 'muted' }, 'No variables were recorded for this run.'));
    return {};
  }
  if (variables.parameter_servers) return psPlacement(target, variables);
  const header = h('tr', {}, [
    h('th', {}, 'variable'),
    h('th', {}, 'shape'),
    h('th', {}, 'dtype'),
    h('th', {}, 'kind'),
    ...variables.replicas.map((id, r) => h('th', {}, deviceName(r) ? `${replicaName(id)} (${deviceName(r)})` : replicaName(id))),
    h('th', {}, 'max rel. L2'),
    h('th', {}, 'max |diff|'),
    h('th', {}, 'drift from step'),
  ]);
  const body = rows.slice(0, MAX_ROWS).map((v) => {
    const drift = v.first_drift_step != null;
    const cells = variables.replicas.map((_, r) =>
      v.present[r] ? h('td', { class: 'copy' }, '✓') : h('td', { class: 'mismatch missing', title: 'no copy on this replica device' }, '—'),
    );
    const kind = [v.trainable ? 'trainable' : 'non-trainable', v.sync === 'on_read' ? 'sync on read' : v.sync === 'none' ? 'plain variable' : null].filter(Boolean).join(', ');
    return h('tr', { class: [!v.mirrored ? 'mismatch' : null, drift ? 'drift' : null], dataset: { variable: v.name, mirrored: String(v.mirrored) } }, [
      h('th', { scope: 'row', title: v.devices.join('\n') }, v.name),
      h('td', {}, `[${(v.shape || []).join(', ')}]`),
      h('td', {}, v.dtype ?? '?'),
      h('td', {}, kind),
      ...cells,
      h('td', { class: drift ? 'mismatch' : null }, v.bit_identical ? '0 (bit-identical)' : fmtDrift(v.max_rel_l2)),
      h('td', {}, v.bit_identical ? '0' : `${v.max_abs_exact || v.max_abs == null ? '' : '≥ '}${fmtDrift(v.max_abs)}`),
      h('td', {}, drift ? String(v.first_drift_step) : '—'),
    ]);
  });
  if (rows.length > MAX_ROWS) target.append(h('p', { class: 'muted' }, `Showing the first ${MAX_ROWS} of ${rows.length} variables.`));
  target.append(h('div', { class: 'table-scroll' }, h('table', { class: 'shapes placement' }, [h('thead', {}, header), h('tbody', {}, body)])));
  return {};
}

/** ParameterServerStrategy: each variable (or shard) has one copy, on one parameter server. */
function psPlacement(target, variables) {
  const held = variables.parameter_servers.variables;
  const header = h('tr', {}, ['variable', 'shape', 'dtype', 'kind', 'parameter server', 'bytes'].map((t) => h('th', {}, t)));
  const body = variables.variables.slice(0, MAX_ROWS).map((v, i) => {
    const on = held[i]?.name === v.name ? held[i] : held.find((p) => p.name === v.name);
    return h('tr', { dataset: { variable: v.name } }, [
      h('th', { scope: 'row', title: v.devices.join('\n') }, v.name),
      h('td', {}, `[${(v.shape || []).join(', ')}]`),
      h('td', {}, v.dtype ?? '?'),
      h('td', {}, v.trainable ? 'trainable' : 'non-trainable'),
      h('td', {}, on?.ps == null ? '— (no parameter server)' : `ps ${on.ps}`),
      h('td', { class: 'num' }, on ? bytesText(on.bytes) : '?'),
    ]);
  });
  if (variables.variables.length > MAX_ROWS) target.append(h('p', { class: 'muted' }, `Showing the first ${MAX_ROWS} of ${variables.variables.length} variables.`));
  target.append(h('div', { class: 'table-scroll' }, h('table', { class: 'shapes placement ps-table' }, [h('thead', {}, header), h('tbody', {}, body)])));
  return {};
}
