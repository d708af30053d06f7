// The "Replicas" tab: TensorBoard imports this module and calls render().
import uplotCss from 'uplot/dist/uPlot.min.css';
import appCss from './style.css';
import { h } from './dom.js';
import { fetchOverview } from './data.js';
import { createZoom } from './zoom.js';
import { createOverview } from './views/overview.js';
import { connectHost, onHost } from './host.js';
import { SECTIONS, deviceNamer, loadGradients, routeLoaders } from './sections.js';
import { isPss, setStrategy } from './names.js';

const setState = (s) => (document.body.dataset.state = s);
let onResize = null;
let refreshTimer = null;
let onHash = null;
/** How often the overview asks for fresh counts when no TensorBoard host tells of reloads. */
const REFRESH_MS = 30000;

/** The run the URL names (`#run=NAME`), or null. */
function runInHash() {
  const m = /(?:^#|&)run=([^&]*)/.exec(location.hash);
  return m ? decodeURIComponent(m[1]) : null;
}

/** Keeps the chosen run in the URL, so a link (or a reload) opens it again. */
function setHash(run) {
  const hash = run ? `#run=${encodeURIComponent(run)}` : '';
  if (location.hash !== hash) history.replaceState(null, '', location.pathname + location.search + hash);
}

const byName = (runs) => [...runs].sort((a, b) => (a.run < b.run ? -1 : a.run > b.run ? 1 : 0));

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
  const hosted = connectHost();
  const status = h('div', { class: 'status', role: 'status' });
  const main = h('main', { id: 'run-view' });
  const overviewBox = h('section', { id: 'overview', dataset: { view: 'overview' } });
  const app = h('div', { class: 'replicas-app' }, [h('h1', {}, 'Replicas'), status, overviewBox, main]);
  document.body.replaceChildren(app);

  let runs;
  try {
    runs = await fetchOverview(); // worst first
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

  const option = (r) => h('option', { value: r.run }, r.run);
  const select = h('select', { id: 'run-select' }, [h('option', { value: '' }, 'All runs (overview)'), ...byName(runs).map(option)]);
  const summary = h('span', { class: 'run-summary muted' });
  const runNotes = h('div', { class: 'run-notes' });
  status.append(h('div', { class: 'run-picker' }, [h('label', { for: 'run-select' }, 'Run'), select, summary]), runNotes);

  let current = null; // {views, abort}
  const strategies = new Map(); // run name → its `/inputs` strategy, once drawn
  window.removeEventListener('resize', onResize); // render() may be called again
  onResize = debounce(() => current?.views.forEach((v) => v.resize?.(widthOf(main))), 150);
  window.addEventListener('resize', onResize);

  const overview = createOverview(overviewBox, {
    runs,
    onOpen: (name) => {
      select.value = name;
      show(name);
    },
  });

  function close() {
    current?.abort.abort();
    current?.views.forEach((v) => v.destroy?.());
    current = null;
  }

  function showOverview() {
    close();
    main.replaceChildren();
    summary.textContent = '';
    runNotes.replaceChildren();
    select.value = '';
    overviewBox.hidden = false;
    setHash(null);
    setState('ready');
  }

  // Live: fresh counts and statuses (and new runs) at each reload of TensorBoard (every
  // REFRESH_MS when the tab is opened on its own); the open run's summary too, its charts when its
  // data changed, else its live sections (the status panel: a state changes with time).
  async function refresh() {
    if (document.hidden) return;
    let fresh;
    try {
      fresh = await fetchOverview();
    } catch {
      return; // the next refresh tries again
    }
    const before = new Map(runs.map((r) => [r.run, r]));
    runs = fresh;
    for (const r of byName(fresh)) if (!before.has(r.run)) select.append(option(r));
    overview.update(fresh);
    const open = fresh.find((r) => r.run === select.value);
    if (open) {
      summary.textContent = runSummary(open, strategies.get(open.run));
      if (changed(before.get(open.run), open)) void show(open.run, { quiet: true });
      else void refreshLive(open);
    }
  }

  /** Asks the open run's live sections' routes again and redraws them; a failure keeps them. */
  async function refreshLive(run) {
    const open = current;
    if (!open?.live?.length) return;
    const loaders = routeLoaders();
    const { signal } = open.abort;
    try {
      for (const { route, view } of open.live) {
        const body = await loaders.get(route)(run, { signal });
        if (signal.aborted || current !== open) return;
        if (body != null) view.update(body);
      }
    } catch {
      // the next reload tries again
    }
  }
  clearInterval(refreshTimer); // render() may be called again
  if (hosted) onHost('experimental.DataReloaded', () => void refresh());
  else refreshTimer = setInterval(refresh, REFRESH_MS);

  /**
   * Opens run `runName`. `quiet`: a live redraw of the open run (new data): the charts shown stay
   * until the new ones are ready (no "Loading…"), the page keeps its scroll position, and a
   * failure keeps them (the next reload tries again).
   */
  async function show(runName, { quiet = false } = {}) {
    quiet = quiet && current != null;
    const abort = new AbortController();
    const views = [];
    if (quiet && current) {
      current.abort.abort(); // a redraw still loading gives way; its views stay until the swap
      current = { views: current.views, abort };
    } else {
      close();
      current = { views, abort };
    }
    overviewBox.hidden = true;
    setHash(runName);
    const run = runs.find((r) => r.run === runName);
    summary.textContent = runSummary(run, strategies.get(run.run));
    if (!quiet) {
      runNotes.replaceChildren(...run.notes.map((n) => h('p', { class: 'note' }, n)));
      main.replaceChildren(h('p', { class: 'muted loading' }, 'Loading…'));
      setState('loading');
    }
    try {
      // Every route the run's sections draw, loaded once each and in parallel.
      const loaders = routeLoaders();
      const routes = [...loaders.keys()];
      const bodies = await Promise.all(routes.map((route) => loaders.get(route)(run, { signal: abort.signal })));
      const data = Object.fromEntries(routes.map((route, i) => [route, bodies[i]]));
      if (abort.signal.aborted) return;
      strategies.set(run.run, data.inputs.strategy);
      summary.textContent = runSummary(run, data.inputs.strategy);
      performance.mark('replicas:data');
      const t0 = performance.now();
      const reloadGradients = async (step) => {
        setState('loading');
        try {
          const next = await loadGradients(run, step, { signal: abort.signal });
          if (abort.signal.aborted) return;
          current.rebuildGradients?.(next);
          setState('ready');
        } catch (e) {
          if (e.name === 'AbortError' || abort.signal.aborted) return;
          showError(main, e);
        }
      };
      const scroll = window.scrollY;
      if (quiet) {
        current.views.forEach((v) => v.destroy?.());
        current.views = views;
        runNotes.replaceChildren(...run.notes.map((n) => h('p', { class: 'note' }, n)));
      }
      Object.assign(current, buildRun(main, run, data, views, reloadGradients));
      if (quiet) window.scrollTo(0, scroll);
      main.dataset.lastStep = String(run.last_step ?? '');
      await new Promise((r) => setTimeout(r, 0)); // let uPlot finish its first draw
      if (abort.signal.aborted) return;
      document.body.dataset.renderMs = String(Math.round(performance.now() - t0));
      performance.mark('replicas:ready');
      setState('ready');
    } catch (e) {
      if (e.name === 'AbortError' || abort.signal.aborted || quiet) return;
      main.replaceChildren();
      showError(main, e);
    }
  }

  const open = (name) => {
    if (!name || !runs.some((r) => r.run === name)) return showOverview();
    select.value = name;
    return show(name);
  };
  select.addEventListener('change', () => open(select.value));
  window.removeEventListener('hashchange', onHash);
  onHash = () => {
    const name = runInHash();
    if (name !== (select.value || null)) {
      select.value = name ?? '';
      open(name);
    }
  };
  window.addEventListener('hashchange', onHash);
  await open(runInHash());
}

/** The worker name of each global replica id of a job (null for a single-worker run). */
function workerNamer(workers) {
  const of = new Map();
  for (const w of workers || []) for (const r of w.replicas) of.set(r, w.name);
  return (id) => of.get(id) ?? null;
}

/** Draws one run: every section of SECTIONS this run has, in order; returns the gradients rebuild
 * and the live sections' views (`[{route, view}]`, redrawn at each reload). */
function buildRun(main, run, data, views, reloadGradients) {
  const { inputs, findings, variables } = data;
  setStrategy(inputs.strategy); // under ParameterServerStrategy the replicas are workers
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

  let width = null;
  const ctx = {
    run,
    data,
    findings,
    steps,
    zoom,
    full,
    lastStep,
    deviceName,
    workerOf,
    views,
    reloadGradients,
    rebuildGradients: null,
    // Measured once, when the first chart asks: after the static content and the findings.
    get width() {
      return (width ??= widthOf(main));
    },
    widthNow: () => widthOf(main),
  };
  const shown = SECTIONS.filter((s) => (s.show ? s.show(ctx) : data[s.route] != null)).map((s) => ({
    s,
    ...section(s.name, typeof s.title === 'function' ? s.title(ctx) : s.title, s.description?.(ctx)),
  }));
  for (const { s, body, el } of shown) s.frame?.(body, ctx, el);
  main.replaceChildren(...shown.map(({ el }) => el));

  ctx.onSelect = (f) => {
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

  const live = [];
  for (const { s, body, el } of shown) {
    const view = s.view(body, ctx, el);
    if (view) views.push(view);
    if (s.live && view?.update) live.push({ route: s.route, view });
  }
  const newNotes = [...new Set([...inputs.notes, ...(variables?.notes ?? [])])].filter((n) => !run.notes.includes(n));
  if (newNotes.length) main.prepend(h('div', { class: 'run-notes' }, newNotes.map((n) => h('p', { class: 'note' }, n))));
  return { rebuildGradients: ctx.rebuildGradients, live };
}

/** Whether an overview entry of a run says its data changed since `before` (more steps or
 * other findings). */
function changed(before, after) {
  if (!before) return true;
  const key = (r) => JSON.stringify([r.first_step, r.last_step, r.findings, r.families]);
  return key(before) !== key(after);
}

/** The run picker's line: replicas (workers under ParameterServerStrategy, `strategy` once the
 * run's `/inputs` told it), steps, source, state. */
function runSummary(run, strategy) {
  const n = run.replicas.length;
  const steps = run.first_step == null ? 'no steps' : `steps ${run.first_step}–${run.last_step}`;
  const workers = run.workers.length ? `${run.workers.length} workers (multi-worker job)` : null;
  const replicas = isPss(strategy) ? `${n} worker${n === 1 ? '' : 's'} (ParameterServerStrategy)` : `${n} replica${n === 1 ? '' : 's'}`;
  return [replicas, workers, steps, run.source && `source: ${run.source}`, run.status.state].filter(Boolean).join(' · ');
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
