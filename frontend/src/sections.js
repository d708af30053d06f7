// The tab's sections, in page order: the one list to extend when a stat family is added.
//
// Each section: `name` (its <section data-view>), `route` (the plugin route whose body it draws;
// index.js loads each route once, with the `load` of the first section naming it), `title` (text,
// or a function returning it: "per replica" or "per worker"),
// `description(ctx)`, `show(ctx)` (whether this run has it; default: its route answered) and
// `frame(body, ctx, el)` (optional: static content, added before any view is drawn),
// `view(body, ctx, el)` (draws it and returns its view object: `{resize?, destroy?, update?}`)
// and `live` (its route is asked again at each reload and given to its view's `update(body)`,
// even when the run has no new data: what it shows changes with time).
// `ctx` holds the run, every loaded route body (`ctx.data[route]`), the shared zoom and namers.
import { h } from './dom.js';
import { fetchInputs, fetchFindings, fetchStatus, fetchRng, fetchData, fetchStepTime, fetchVariables, fetchGradients, fetchWatch } from './data.js';
import { createFindings } from './views/findings.js';
import { createStatusPanel } from './views/status_panel.js';
import { createBatchChart } from './views/batch_chart.js';
import { createImbalanceChart } from './views/imbalance_chart.js';
import { createHeatmap } from './views/heatmap.js';
import { createShapesTable } from './views/shapes_table.js';
import { CANVAS_SIDE } from './views/match_matrix.js';
import { createRngView } from './views/rng_view.js';
import { createDataView } from './views/data_view.js';
import { createGradients } from './views/gradients.js';
import { createStepTime } from './views/step_time.js';
import { createReadyTimes } from './views/ready_times.js';
import { createPssWorkers } from './views/pss_workers.js';
import { createDriftChart, createDeviationChart } from './views/drift_charts.js';
import { createPlacementTable } from './views/placement_table.js';
import { createPsTable } from './views/ps_table.js';
import { replicaNoun } from './names.js';
import { createWatchView } from './views/watch_view.js';

/** Steps asked of every route: exact up to this many, bucketed (with min/max) beyond. */
export const MAX_POINTS = 10000;
/** Step × replica values asked per series: a run of many replicas gets fewer steps. */
const MAX_CELLS = 262144;
/** Most divergent variables drawn over steps. */
const TOP_VARIABLES = 8;
/** Most lines or rows per chart of per-replica values (batch sizes, gradients, drift): a run of
 * more replicas is asked for this many blocks of replicas, each its worst value. */
const REPLICA_BLOCKS = 64;
/** The rng view draws the groups of the last logged step only (its match matrices cover every
 * step): it asks the first and last steps (rng/present.py RUN_VIEW_ARGS). */
const RNG_STEPS = 2;

/**
 * The `max_points` the run view asks for `run` (a `/runs` entry): MAX_POINTS steps, fewer when
 * steps × replicas would pass MAX_CELLS (a 2,048-replica job: 128 step buckets), so a large
 * job's bodies stay a few MB to parse and draw. plugin.py's run_view_query gives the same.
 */
export function maxPoints(run) {
  return Math.max(2, Math.min(MAX_POINTS, Math.floor(MAX_CELLS / Math.max(1, run.replicas.length))));
}
/** The run view's `./gradients` of `run` (a `/runs` entry), its layer matrix at `step` (null:
 * the server's choice). */
export const loadGradients = (run, step, opts) => fetchGradients(run.run, maxPoints(run), step, opts, REPLICA_BLOCKS);
const BATCH_KINDS = new Set(['uneven_batch', 'empty_shard', 'first_batch_uneven']);

/** "CPU:0" from "/job:localhost/replica:0/task:0/device:CPU:0", with the task when tasks differ. */
export function deviceNamer(devices) {
  const parse = (d) => ({
    dev: /device:([^/]+)$/.exec(d || '')?.[1] ?? (d || ''),
    task: /\/job:([^/]+)\/replica:\d+\/task:(\d+)/.exec(d || '')?.slice(1).join(':'),
  });
  const parsed = devices.map(parse);
  const tasks = new Set(parsed.map((p) => p.task));
  return (r) => {
    const p = parsed[r];
    if (!p) return '';
    return tasks.size > 1 && p.task ? `${p.task}/${p.dev}` : p.dev;
  };
}

/** Runs make() and records its duration as a performance measure "replicas:NAME". */
export function timed(name, make) {
  const start = performance.now();
  const view = make();
  performance.measure(`replicas:${name}`, { start, end: performance.now() });
  return view;
}

const hasSteps = (ctx) => ctx.steps.length && ctx.data.inputs.replicas.length;
const noSteps = (body) => body.append(h('p', { class: 'muted' }, 'No steps recorded for this run yet.'));
const hasVariables = (ctx) => Boolean(ctx.data.variables?.variables.length);
/** ParameterServerStrategy: one copy of each variable (no drift); its parameter servers' bytes. */
const psHeld = (ctx) => ctx.data.variables?.parameter_servers ?? null;
const hasDrift = (ctx) => hasVariables(ctx) && !psHeld(ctx);
const drift = (ctx) => ({
  variables: ctx.data.variables,
  zoom: ctx.zoom,
  width: ctx.width,
  deviceName: deviceNamer(ctx.data.variables.devices.length ? ctx.data.variables.devices : ctx.run.devices),
});
const inputsCtx = (ctx) => ({ inputs: ctx.data.inputs, zoom: ctx.zoom, width: ctx.width, lastStep: ctx.lastStep, deviceName: ctx.deviceName, workerOf: ctx.workerOf });

/** The step-time section: per-worker busy time (a job), then per-replica ready times. */
function createStepTimeSection(body, ctx) {
  const data = ctx.data.step_time;
  const named = (kind) => ctx.findings.filter((f) => f.kind === kind);
  const views = [];
  // A job's per-worker table, unless the job has ready times and no per-worker timing at all.
  if (ctx.run.workers.length && (data.steps.length || !data.ready)) {
    const box = h('div', { dataset: { part: 'workers' } });
    body.append(h('h3', {}, 'Busy time per worker'), box);
    const stragglers = new Set(named('straggler').map((f) => f.name));
    views.push(createStepTime(box, { data, zoom: ctx.zoom, width: ctx.width, stragglers }));
  }
  if (data.pss_workers) {
    const box = h('div', { dataset: { part: 'pss-workers' } });
    body.append(h('h3', {}, 'Steps each worker ran'), box);
    views.push(createPssWorkers(box, { totals: data.pss_workers }));
  }
  if (data.ready) {
    const box = h('div', { dataset: { part: 'replicas' } });
    body.append(h('h3', {}, data.pss_workers ? 'Step time per worker' : 'Ready time per replica'), box);
    const slow = new Set(named('slow_replica').flatMap((f) => f.replicas));
    views.push(createReadyTimes(box, { ready: data.ready, zoom: ctx.zoom, width: ctx.width, slow, workerOf: ctx.workerOf }));
  }
  return {
    resize: (w) => views.forEach((v) => v.resize?.(w)),
    destroy: () => views.forEach((v) => v.destroy?.()),
  };
}

export const SECTIONS = [
  {
    name: 'status',
    route: 'status',
    load: (run, opts) => (run.status.state != null || run.families.includes('status') ? fetchStatus(run.run, opts) : null),
    title: 'Status',
    description: (ctx) =>
      ctx.run.workers.length
        ? "How the job is going or how it ended, worker by worker, from their heartbeats. A stalled or crashed worker shows its training thread's stack and its exception; the root cause is the job's first observed failure."
        : "How the run is going or how it ended, from its heartbeats. A stalled or crashed run shows its training thread's stack and its exception.",
    show: (ctx) => ctx.data.status?.state != null,
    live: true,
    view: (body, ctx) => createStatusPanel(body, { status: ctx.data.status, multiWorker: ctx.run.workers.length > 0 }),
  },
  {
    name: 'findings',
    route: 'findings',
    load: (run, opts) => fetchFindings(run.run, opts),
    title: 'Findings',
    show: () => true,
    view: (body, ctx) => createFindings(body, { findings: ctx.findings, onSelect: ctx.onSelect, workerOf: ctx.workerOf }),
  },
  {
    name: 'step_time',
    route: 'step_time',
    // Per-worker step time of a multi-worker job, and each replica's ready time when recorded.
    load: (run, opts) =>
      run.workers.length || run.families.includes('step_time') ? fetchStepTime(run.run, maxPoints(run), opts, REPLICA_BLOCKS) : null,
    title: 'Step time',
    description: (ctx) =>
      [
        ctx.run.workers.length
          ? 'Per worker: busy time per step of each worker of this multi-worker job, its step period minus the time it waited for the last worker to arrive (taken when its step inputs were ready). The workers wait for a straggler at every all-reduce.'
          : null,
        ctx.data.step_time?.pss_workers
          ? "ParameterServerStrategy: each worker runs the steps the coordinator gives it, without waiting for the others. Per worker: the steps it ran (also those past the slowest worker's last step, which are not recorded as steps), its seconds busy and its steps per second; below, its step seconds (the scheduled step's start to end, on its clock) at the steps every worker ran. A worker far behind the others is a straggler: its updates fall behind."
          : null,
        ctx.data.step_time?.ready && !ctx.data.step_time?.pss_workers
          ? "Per replica: its ready time, from the step's start until its local gradients reached the host. The other replicas of its worker wait for the slowest at every all-reduce; a replica slower than the others (a throttled or busier GPU, more work) is a slow replica."
          : null,
      ]
        .filter(Boolean)
        .join(' '),
    view: (body, ctx) => timed('step_time', () => createStepTimeSection(body, ctx)),
  },
  {
    name: 'batch',
    route: 'inputs',
    load: (run, opts) => fetchInputs(run.run, maxPoints(run), opts, REPLICA_BLOCKS),
    title: () => `Batch size per ${replicaNoun()}`,
    description: (ctx) =>
      ctx.data.inputs.downsampled
        ? `Downsampled to ${ctx.steps.length} buckets: each line shows the smallest batch of its bucket. Drag to zoom, double-click to reset; click a legend entry to hide a replica.`
        : 'Examples each replica got at each step. Drag to zoom, double-click to reset; click a legend entry to hide a replica.',
    show: () => true,
    // The static part (reset button, chart slot, batch-size notes) is in place before any chart
    // is drawn and before the chart width is measured.
    frame: (body, ctx, el) => {
      const resetZoom = h('button', { type: 'button', class: 'reset-zoom', dataset: { action: 'reset-zoom' }, onclick: () => ctx.zoom.reset() }, 'Reset zoom');
      el.querySelector('h2').append(resetZoom);
      const chart = h('div', { class: 'chart' });
      const batchFindings = ctx.findings.filter((f) => BATCH_KINDS.has(f.kind));
      const notes = h(
        'div',
        { dataset: { view: 'notes' }, class: 'notes' },
        batchFindings.length
          ? batchFindings.map((f) => h('p', { class: 'note', dataset: { severity: f.severity, kind: f.kind } }, f.message))
          : [h('p', { class: 'note ok' }, 'No batch-size problems found in this run.')],
      );
      body.append(chart, notes);
      const showZoom = (min, max) => Object.assign(el.dataset, { zoomMin: min, zoomMax: max });
      showZoom(...ctx.full);
      ctx.zoom.subscribe(showZoom);
      ctx.batchChart = chart;
    },
    view: (body, ctx) => (hasSteps(ctx) ? timed('batch', () => createBatchChart(ctx.batchChart, inputsCtx(ctx))) : noSteps(ctx.batchChart)),
  },
  {
    name: 'imbalance',
    route: 'inputs',
    title: 'Imbalance',
    description: (ctx) =>
      'Largest over smallest batch across replicas at each step (1 = even). When a replica got nothing the ratio is infinite: drawn at the red dashed line and marked "empty replica".' +
      (ctx.data.inputs.downsampled
        ? ' Downsampled: the solid line is the ratio at the first step of each bucket, the light dashed line an upper bound over the whole bucket.'
        : ''),
    show: () => true,
    view: (body, ctx) => (hasSteps(ctx) ? timed('imbalance', () => createImbalanceChart(body, inputsCtx(ctx))) : noSteps(body)),
  },
  {
    name: 'heatmap',
    route: 'inputs',
    title: 'Batch size heatmap',
    description: () => 'One row per replica. Hover for values, drag to zoom, double-click to reset.',
    show: () => true,
    view: (body, ctx) => (hasSteps(ctx) ? timed('heatmap', () => createHeatmap(body, inputsCtx(ctx))) : noSteps(body)),
  },
  {
    name: 'gradients',
    route: 'gradients',
    load: (run, opts) => (run.families.includes('gradients') ? loadGradients(run, null, opts) : null),
    title: () => `Gradients per ${replicaNoun()}`,
    description: (ctx) => {
      const grads = ctx.data.gradients;
      return `Local gradients of every replica before the optimizer's all-reduce, at ${grads.steps.length} logged step${grads.steps.length === 1 ? '' : 's'}${grads.downsampled ? ' (downsampled: bucket maxima)' : ''}; NaN/Inf are checked at every step. Drag to zoom, double-click to reset.`;
    },
    view: (body, ctx) => {
      const outlier = ctx.findings.find((f) => f.kind === 'gradient_norm_outlier');
      const threshold = outlier && Number.isFinite(outlier.threshold) ? outlier.threshold : 10;
      let view = null;
      // Redrawn at another step (a click on the norms chart reloads ./gradients at that step).
      ctx.rebuildGradients = (next) => {
        const at = ctx.views.indexOf(view);
        view?.destroy?.();
        body.replaceChildren();
        view = createGradients(body, { grads: next, zoom: ctx.zoom, width: ctx.widthNow(), threshold, onStep: ctx.reloadGradients, workerOf: ctx.workerOf });
        if (at >= 0) ctx.views[at] = view;
        else ctx.views.push(view);
      };
      timed('gradients', () => ctx.rebuildGradients(ctx.data.gradients));
      return null; // rebuildGradients keeps its view in ctx.views
    },
  },
  {
    name: 'shapes',
    route: 'inputs',
    title: 'Input shapes',
    description: () =>
      "Each input's shape and dtype per replica, at the first step and at every step where they change. Highlighted: inputs the replicas disagree on (dtype, rank or a non-leading dimension).",
    show: () => true,
    view: (body, ctx) => timed('shapes', () => createShapesTable(body, { inputs: ctx.data.inputs, deviceName: ctx.deviceName })),
  },
  {
    name: 'rng',
    route: 'rng',
    load: (run, opts) => fetchRng(run.run, RNG_STEPS, opts, CANVAS_SIDE),
    title: 'Random streams',
    description: () =>
      "Per generator: how often two replicas draw identical numbers (same next-draw fingerprint), and each replica's state at the last logged step. A state equal on every replica does not mean equal streams: tf.random.Generator folds the replica id into its key.",
    view: (body, ctx) => timed('rng', () => createRngView(body, { rng: ctx.data.rng, deviceName: ctx.deviceName, workerOf: ctx.workerOf })),
  },
  {
    name: 'data',
    route: 'data',
    load: (run, opts) => fetchData(run.run, maxPoints(run), opts, CANVAS_SIDE),
    title: 'Examples per replica',
    description: () =>
      'Per pair of replicas: the share of examples both got at the same step (per-example fingerprints). Non-zero off the diagonal means replicas train on the same data: an unsharded input pipeline.',
    view: (body, ctx) => timed('data', () => createDataView(body, { data: ctx.data.data, deviceName: ctx.deviceName, workerOf: ctx.workerOf })),
  },
  {
    name: 'parameter_servers',
    route: 'variables',
    title: 'Parameter servers',
    description: (ctx) =>
      `ParameterServerStrategy: each variable (or shard of a partitioned one) has one copy, on one parameter server, so weight drift does not apply. The bytes of the observed variables each parameter server holds, its share and its largest variable; highlighted: a server of a ps_imbalance finding (more than ${(psHeld(ctx).share_threshold * 100).toFixed(1)} % of them, when they are large enough to matter; a variable_partitioner spreads a large variable).`,
    show: (ctx) => psHeld(ctx) != null,
    view: (body, ctx) => timed('parameter_servers', () => createPsTable(body, { servers: psHeld(ctx), findings: ctx.findings })),
  },
  {
    name: 'drift',
    route: 'variables',
    load: (run, opts) => fetchVariables(run.run, maxPoints(run), TOP_VARIABLES, opts, REPLICA_BLOCKS),
    title: 'Weight drift',
    description: () =>
      "How far each variable's copies are from replica 0's: relative L2 distance ||copy_r − copy_0|| / ||copy_0|| at each logged step, for the most divergent variables (worst replica). Estimated from small per-copy fingerprints unless the exact check ran; 0 means bit-identical.",
    show: hasDrift,
    view: (body, ctx) => timed('drift', () => createDriftChart(body, drift(ctx))),
  },
  {
    name: 'deviation',
    route: 'variables',
    title: 'Deviation from replica 0, per replica',
    description: () => 'One variable, one line per replica.',
    show: hasDrift,
    view: (body, ctx) => timed('deviation', () => createDeviationChart(body, drift(ctx))),
  },
  {
    name: 'placement',
    route: 'variables',
    title: 'Variable placement',
    description: (ctx) =>
      psHeld(ctx)
        ? 'Every observed variable (or shard), the parameter server holding its one copy, and its bytes.'
        : 'Every variable, and which replica devices hold a copy of it. Highlighted: variables not mirrored on every replica, and variables whose copies drift beyond the tolerance.',
    show: hasVariables,
    view: (body, ctx) => timed('placement', () => createPlacementTable(body, drift(ctx))),
  },
  {
    name: 'watch',
    route: 'watch',
    load: (run, opts) => (run.families.includes('watch') ? fetchWatch(run.run, maxPoints(run), opts) : null),
    title: 'Watched values',
    description: () =>
      "Values recorded with probe.watch (in fit: the model's outputs), per replica: each leaf's local shape and dtype at every change (highlighted: strategy.gather(axis=0) would fail on them; a ragged dimension is None), and min, max, mean, L2, NaN/Inf and sizes at the latest sampled step.",
    view: (body, ctx) => timed('watch', () => createWatchView(body, { watch: ctx.data.watch, deviceName: ctx.deviceName })),
  },
];

/** Each route's loader: the `load` of the first section naming it, in section order. */
export function routeLoaders() {
  const loaders = new Map();
  for (const s of SECTIONS) if (s.load && !loaders.has(s.route)) loaders.set(s.route, s.load);
  return loaders;
}
