// Random generators per replica: which replicas draw the same numbers, and their states.
import { h, shortList } from '../dom.js';
import { createMatchMatrix, replicaText } from './match_matrix.js';

const pct = (v) => `${Math.round(100 * v)}%`;

function groupsText(groups, replicas) {
  const byGroup = new Map();
  groups.forEach((g, r) => byGroup.set(g, [...(byGroup.get(g) || []), replicas[r]]));
  const same = [...byGroup.values()].filter((ids) => ids.length > 1);
  if (!same.length) return 'every replica draws its own numbers';
  return same.map((ids) => `replicas ${shortList(ids, 8)} draw the same numbers`).join('; ');
}

function generatorBlock(gen, rng, deviceName, workerOf) {
  const { replicas } = rng;
  const lastGroups = gen.stream_groups[gen.stream_groups.length - 1] || [];
  const lastStates = gen.state_groups[gen.state_groups.length - 1] || [];
  const counts = new Map();
  lastStates.forEach((g) => counts.set(g, (counts.get(g) || 0) + 1));
  const majority = [...counts].sort((a, b) => b[1] - a[1])[0]?.[0];
  const kind = [gen.kind, gen.layer_class && `layer ${gen.layer} (${gen.layer_class})`, gen.mirrored ? 'mirrored state' : 'unmirrored state'].filter(Boolean).join(' · ');
  const matrix = !gen.mirrored
    ? h('p', { class: 'muted unmirrored' }, 'One state shared by every replica (created outside strategy.scope()): TensorFlow serialises the replicas\' draws, each takes the next part of one stream, so fingerprints are not compared.')
    : createMatchMatrix({
    replicas,
    matrix: gen.match,
    pooled: gen.pooled,
    deviceName,
    workerOf,
    title: 'Logged steps where two replicas draw identical numbers',
    cellText: (r, q) => pct(gen.match[r][q]),
  });
  const stateRows = replicas.map((id, r) => {
    const desync = gen.mirrored && lastStates[r] !== majority;
    return h('tr', { class: desync ? 'desync' : null, dataset: { replica: id } }, [
      h('th', { scope: 'row' }, replicaText(id, workerOf)),
      h('td', {}, (gen.last_state[r] || []).join(' ')),
      h('td', {}, gen.last_fingerprint[r] || ''),
      h('td', {}, desync ? 'desynchronised' : gen.mirrored ? 'in sync' : 'not mirrored'),
    ]);
  });
  const states = h('table', { class: 'shapes rng-states' }, [
    h('caption', {}, `At step ${rng.steps[rng.steps.length - 1]}: ${gen.mirrored ? groupsText(lastGroups, replicas) : 'shared state'}`),
    h('thead', {}, h('tr', {}, [h('th', {}, ''), h('th', {}, 'state (hex words)'), h('th', {}, 'next-draw fingerprint'), h('th', {}, 'state vs other replicas')])),
    h('tbody', {}, stateRows),
  ]);
  return h('div', { class: 'generator', dataset: { generator: gen.name } }, [
    h('h3', {}, [gen.name, ' ', h('span', { class: 'muted' }, kind)]),
    h('div', { class: 'matrix-row' }, [matrix, h('div', { class: 'table-scroll' }, states)]),
  ]);
}

export function createRngView(target, { rng, deviceName, workerOf = () => null }) {
  if (!rng || !rng.generators.length) {
    target.append(h('p', { class: 'muted' }, 'No random generators were recorded for this run (ReplicaCallback records the SeedGenerators of the model\'s layers; custom loops call probe.observe_rng).'));
    return {};
  }
  if (rng.downsampled) target.append(h('p', { class: 'muted' }, `${rng.logged_steps} logged steps; matrices cover all of them.`));
  for (const gen of rng.generators) target.append(generatorBlock(gen, rng, deviceName, workerOf));
  return {};
}
