// The "Replicas" tab: TensorBoard imports this module and calls render().
import uplotCss from 'uplot/dist/uPlot.min.css';
import appCss from './style.css';
import { h } from './dom.js';
import { fetchRuns, fetchInputs, fetchFindings, fetchRng, fetchData, fetchStepTime, fetchVariables, fetchGradients } from './data.js';
import { createZoom } from './zoom.js';
import { createFindings } from './views/findings.js';
import { createBatchChart } from './views/batch_chart.js';
import { createImbalanceChart } from './views/imbalance_chart.js';
import { createHeatmap } from './views/heatmap.js';
import { createShapesTable } from './views/shapes_table.js';
import { createRngView } from './views/rng_view.js';
import { createDataView } from './views/data_view.js';
import { createGradients } from './views/gradients.js';
import { createStepTime } from './views/step_time.js';
import { createDriftChart, createDeviationChart } from './views/drift_charts.js';
import { createPlacementTable } from './views/placement_table.js';

/** Steps asked of ./inputs: exact up to this many, bucketed (with min/max) beyond. */
const MAX_POINTS = 10000;
/** Most divergent variables drawn over steps. */
const TOP_VARIABLES = 8;
const BATCH_KINDS = new Set(['uneven_batch', 'empty_shard', 'first_batch_uneven']);

const setState = (s) => (document.body.dataset.state = s);
let onResize = null;

/** "CPU:0" from "/job:localhost/replica:0/task:0/device:CPU:0", with the task when tasks differ. */
function deviceNamer(devices) {
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

function section(view, title, description) {
  const body = h('div', { class: 'section-body' });
  const el = h('section', { dataset: { view } }, [h('h2', {}, title), description ? h('p', { class: 'muted' }, description) : null, body]);
  return { el, body };
}

export async function render() {
  if (!document.getElementById('replicas-style')) {
    document.head.appendChild(h('style', { id: 'replicas-style' }, uplotCss + '\n' + appCss));
  }
  setState('loading');
  const status = h('div', { class: 'status', role: 'status' });
  const main = h('main', { id: 'run-view' });
  const app = h('div', { class: 'replicas-app' }, [h('h1', {}, 'Replicas'), status, main]);
  document.body.replaceChildren(app);

  let runs;
  try {
    runs = await fetchRuns();
  } catch (e) {
    showError(status, e);
    return;
  }
  if (!runs.length) {
    status.append(
      h('div', { class: 'empty-state' }, [
        h('p', {}, 'No replica data yet…'),
        h('p', { class: 'muted' }, 'Log some with ReplicaCallback (Keras fit), ReplicaProbe (custom loops) or the dataset inspector, then reload.'),
      ]),
    );
    setState('ready');
    return;
  }

  const select = h('select', { id: 'run-select' }, runs.map((r) => h('option', { value: r.run }, r.run)));
  const summary = h('span', { class: 'run-summary muted' });
  const runNotes = h('div', { class: 'run-notes' });
  status.append(h('div', { class: 'run-picker' }, [h('label', { for: 'run-select' }, 'Run'), select, summary]), runNotes);

  let current = null; // {views, abort}
  window.removeEventListener('resize', onResize); // render() may be called again
  onResize = debounce(() => current?.views.forEach((v) => v.resize?.(widthOf(main))), 150);
  window.addEventListener('resize', onResize);

  async function show(runName) {
    current?.abort.abort();
    current?.views.forEach((v) => v.destroy?.());
    const abort = new AbortController();
    const views = [];
    current = { views, abort };
    const run = runs.find((r) => r.run === runName);
    summary.textContent = runSummary(run);
    runNotes.replaceChildren(...run.notes.map((n) => h('p', { class: 'note' }, n)));
    main.replaceChildren(h('p', { class: 'muted loading' }, 'Loading…'));
    setState('loading');
    try {
      const hasGradients = run.families.includes('gradients');
      const [inputs, findings, rng, data, stepTime, variables, grads] = await Promise.all([
        fetchInputs(runName, MAX_POINTS, { signal: abort.signal }),
        fetchFindings(runName, { signal: abort.signal }),
        fetchRng(runName, MAX_POINTS, { signal: abort.signal }),
        fetchData(runName, MAX_POINTS, { signal: abort.signal }),
        // Multi-worker jobs only: per-worker step time.
        run.workers.length ? fetchStepTime(runName, MAX_POINTS, { signal: abort.signal }) : null,
        fetchVariables(runName, MAX_POINTS, TOP_VARIABLES, { signal: abort.signal }),
        hasGradients ? fetchGradients(runName, MAX_POINTS, null, { signal: abort.signal }) : null,
      ]);
      if (abort.signal.aborted) return;
      performance.mark('replicas:data');
      const t0 = performance.now();
      const reloadGradients = async (step) => {
        setState('loading');
        try {
          const next = await fetchGradients(runName, MAX_POINTS, step, { signal: abort.signal });
          if (abort.signal.aborted) return;
          current.rebuildGradients?.(next);
          setState('ready');
        } catch (e) {
          if (e.name === 'AbortError' || abort.signal.aborted) return;
          showError(main, e);
        }
      };
      current.rebuildGradients = buildRun(main, run, inputs, findings, views, { rng, data, stepTime, variables, grads, reloadGradients });
      await new Promise((r) => setTimeout(r, 0)); // let uPlot finish its first draw
      if (abort.signal.aborted) return;
      document.body.dataset.renderMs = String(Math.round(performance.now() - t0));
      performance.mark('replicas:ready');
      setState('ready');
    } catch (e) {
      if (e.name === 'AbortError' || abort.signal.aborted) return;
      main.replaceChildren();
      showError(main, e);
    }
  }

  select.addEventListener('change', () => show(select.value));
  await show(runs[0].run);
}

/** The worker name of each global replica id of a job (null for a single-worker run). */
function workerNamer(workers) {
  const of = new Map();
  for (const w of workers || []) for (const r of w.replicas) of.set(r, w.name);
  return (id) => of.get(id) ?? null;
}

function buildRun(main, run, inputs, findings, views, { rng, data, stepTime, variables, grads, reloadGradients } = {}) {
  const steps = inputs.steps;
  const workerOf = workerNamer(inputs.workers.length ? inputs.workers : run.workers);
  const lastStep = run.last_step ?? steps[steps.length - 1] ?? 0;
  // Step ranges are [start, end): the last step gets its full width. Inputs and variables share it.
  const varSteps = variables?.steps ?? [];
  const allSteps = steps.length ? steps : varSteps;
  const firstStep = Math.min(allSteps[0] ?? Infinity, varSteps[0] ?? Infinity, run.first_step ?? Infinity);
  const full = Number.isFinite(firstStep) ? [firstStep, Math.max(allSteps[allSteps.length - 1] ?? firstStep, lastStep) + 1] : [0, 1];
  const zoom = createZoom(full);
  const deviceName = deviceNamer(inputs.devices.length ? inputs.devices : run.devices);

  const findingsSec = section('findings', 'Findings');
  const batch = section(
    'batch',
    'Batch size per replica',
    inputs.downsampled
      ? `Downsampled to ${steps.length} buckets: each line shows the smallest batch of its bucket. Drag to zoom, double-click to reset; click a legend entry to hide a replica.`
      : 'Examples each replica got at each step. Drag to zoom, double-click to reset; click a legend entry to hide a replica.',
  );
  const resetZoom = h('button', { type: 'button', class: 'reset-zoom', dataset: { action: 'reset-zoom' }, onclick: () => zoom.reset() }, 'Reset zoom');
  batch.el.querySelector('h2').append(resetZoom);
  const chart = h('div', { class: 'chart' });
  const batchFindings = findings.filter((f) => BATCH_KINDS.has(f.kind));
  const notes = h(
    'div',
    { dataset: { view: 'notes' }, class: 'notes' },
    batchFindings.length
      ? batchFindings.map((f) => h('p', { class: 'note', dataset: { severity: f.severity, kind: f.kind } }, f.message))
      : [h('p', { class: 'note ok' }, 'No batch-size problems found in this run.')],
  );
  batch.body.append(chart, notes);
  const showZoom = (min, max) => Object.assign(batch.el.dataset, { zoomMin: min, zoomMax: max });
  showZoom(...full);
  zoom.subscribe(showZoom);
  const imbalance = section(
    'imbalance',
    'Imbalance',
    'Largest over smallest batch across replicas at each step (1 = even). When a replica got nothing the ratio is infinite: drawn at the red dashed line and marked "empty replica".' +
      (inputs.downsampled
        ? ' Downsampled: the solid line is the ratio at the first step of each bucket, the light dashed line an upper bound over the whole bucket.'
        : ''),
  );
  const heat = section('heatmap', 'Batch size heatmap', 'One row per replica. Hover for values, drag to zoom, double-click to reset.');
  const shapes = section('shapes', 'Input shapes', 'Each input\'s shape and dtype per replica, at the first step and at every step where they change. Highlighted: inputs the replicas disagree on (dtype, rank or a non-leading dimension).');
  const rngSec = section('rng', 'Random streams', 'Per generator: how often two replicas draw identical numbers (same next-draw fingerprint), and each replica\'s state at the last logged step. A state equal on every replica does not mean equal streams: tf.random.Generator folds the replica id into its key.');
  const dataSec = section('data', 'Examples per replica', 'Per pair of replicas: the share of examples both got at the same step (per-example fingerprints). Non-zero off the diagonal means replicas train on the same data: an unsharded input pipeline.');
  const drift = section(
    'drift',
    'Weight drift',
    'How far each variable\'s copies are from replica 0\'s: relative L2 distance ||copy_r − copy_0|| / ||copy_0|| at each logged step, for the most divergent variables (worst replica). Estimated from small per-copy fingerprints unless the exact check ran; 0 means bit-identical.',
  );
  const deviation = section('deviation', 'Deviation from replica 0, per replica', 'One variable, one line per replica.');
  const placement = section(
    'placement',
    'Variable placement',
    'Every variable, and which replica devices hold a copy of it. Highlighted: variables not mirrored on every replica, and variables whose copies drift beyond the tolerance.',
  );
  const timing = stepTime
    ? section(
        'step_time',
        'Step time per worker',
        'Busy time per step of each worker of this multi-worker job: its step period minus the time it waited for the last worker to arrive (taken when its step inputs were ready). The workers wait for a straggler at every all-reduce.',
      )
    : null;
  const gradients = grads
    ? section('gradients', 'Gradients per replica', `Local gradients of every replica before the optimizer's all-reduce, at ${grads.steps.length} logged step${grads.steps.length === 1 ? '' : 's'}${grads.downsampled ? ' (downsampled: bucket maxima)' : ''}; NaN/Inf are checked at every step. Drag to zoom, double-click to reset.`)
    : null;
  main.replaceChildren(...[findingsSec.el, timing?.el, batch.el, imbalance.el, heat.el, gradients?.el, shapes.el].filter(Boolean));
  if (rng) main.append(rngSec.el);
  if (data) main.append(dataSec.el);
  if (variables?.variables.length) main.append(drift.el, deviation.el, placement.el);

  const onSelect = (f) => {
    const view = f.view && main.querySelector(`section[data-view="${CSS.escape(f.view)}"]`) ? f.view : /shape|dtype|rank/.test(f.kind) ? 'shapes' : 'batch';
    let target = main.querySelector(`section[data-view="${CSS.escape(view)}"]`);
    if (view === 'shapes' && f.first_step != null) {
      target = main.querySelector(`table.shapes[data-step="${CSS.escape(String(f.first_step))}"]`) || target;
    }
    if (f.first_step != null && Number.isFinite(f.first_step) && steps.length) {
      const last = Number.isFinite(f.last_step) ? f.last_step : f.first_step;
      const pad = Math.max(2, Math.ceil((last - f.first_step) * 0.1));
      zoom.set(Math.max(full[0], f.first_step - pad), Math.min(full[1], last + 1 + pad));
    }
    target.scrollIntoView({ behavior: 'smooth', block: 'start' });
    target.classList.remove('flash');
    void target.offsetWidth; // restart the highlight animation
    target.classList.add('flash');
  };

  views.push(createFindings(findingsSec.body, { findings, onSelect, workerOf }));
  const width = widthOf(main);
  if (!steps.length || !inputs.replicas.length) {
    for (const s of [chart, imbalance.body, heat.body]) s.append(h('p', { class: 'muted' }, 'No steps recorded for this run yet.'));
  } else {
    const ctx = { inputs, zoom, width, lastStep, deviceName, workerOf };
    views.push(
      timed('batch', () => createBatchChart(chart, ctx)),
      timed('imbalance', () => createImbalanceChart(imbalance.body, ctx)),
      timed('heatmap', () => createHeatmap(heat.body, ctx)),
    );
  }
  views.push(timed('shapes', () => createShapesTable(shapes.body, { inputs, deviceName })));
  if (rng) views.push(timed('rng', () => createRngView(rngSec.body, { rng, deviceName, workerOf })));
  if (data) views.push(timed('data', () => createDataView(dataSec.body, { data, deviceName, workerOf })));
  if (timing) {
    const stragglers = new Set(findings.filter((f) => f.kind === 'straggler').map((f) => f.name));
    views.push(timed('step_time', () => createStepTime(timing.body, { data: stepTime, zoom, width, stragglers })));
  }
  if (variables?.variables.length) {
    const variableDevice = deviceNamer(variables.devices.length ? variables.devices : run.devices);
    const driftCtx = { variables, zoom, width, deviceName: variableDevice };
    views.push(
      timed('drift', () => createDriftChart(drift.body, driftCtx)),
      timed('deviation', () => createDeviationChart(deviation.body, driftCtx)),
      timed('placement', () => createPlacementTable(placement.body, driftCtx)),
    );
  }
  let rebuildGradients = null;
  if (gradients) {
    const outlier = findings.find((f) => f.kind === 'gradient_norm_outlier');
    const threshold = outlier && Number.isFinite(outlier.threshold) ? outlier.threshold : 10;
    let view = null;
    rebuildGradients = (next) => {
      const at = views.indexOf(view);
      view?.destroy?.();
      gradients.body.replaceChildren();
      view = createGradients(gradients.body, { grads: next, zoom, width: widthOf(main), threshold, onStep: reloadGradients, workerOf });
      if (at >= 0) views[at] = view;
      else views.push(view);
    };
    timed('gradients', () => rebuildGradients(grads));
  }
  const newNotes = [...new Set([...inputs.notes, ...(variables?.notes ?? [])])].filter((n) => !run.notes.includes(n));
  if (newNotes.length) main.prepend(h('div', { class: 'run-notes' }, newNotes.map((n) => h('p', { class: 'note' }, n))));
  return rebuildGradients;
}

/** Runs make() and records its duration as a performance measure "replicas:NAME". */
function timed(name, make) {
  const start = performance.now();
  const view = make();
  performance.measure(`replicas:${name}`, { start, end: performance.now() });
  return view;
}

function runSummary(run) {
  const n = run.replicas.length;
  const steps = run.first_step == null ? 'no steps' : `steps ${run.first_step}–${run.last_step}`;
  const workers = run.workers.length ? `${run.workers.length} workers (multi-worker job)` : null;
  return [`${n} replica${n === 1 ? '' : 's'}`, workers, steps, run.source && `source: ${run.source}`].filter(Boolean).join(' · ');
}

function showError(where, e) {
  where.append(h('div', { class: 'error', role: 'alert' }, `Could not load replica data: ${e.message}`));
  setState('error');
}

const widthOf = (el) => Math.max(320, el.clientWidth - 2);

function debounce(fn, ms) {
  let t;
  return () => {
    clearTimeout(t);
    t = setTimeout(fn, ms);
  };
}
