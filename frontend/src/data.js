// Fetching and parsing of the plugin's JSON routes (see tb_replica_plugin/http_api.md).
// All URLs are relative: TensorBoard serves the tab from /data/plugin/replicas/.

const NON_FINITE = { NaN: NaN, Infinity: Infinity, '-Infinity': -Infinity };

/** A number from a JSON value: TensorBoard writes non-finite floats as strings. */
export function toNumber(v) {
  if (typeof v === 'number') return v;
  if (v == null) return null;
  if (typeof v === 'string' && v in NON_FINITE) return NON_FINITE[v];
  const n = Number(v);
  return Number.isNaN(n) ? NaN : n;
}

const numbers = (a) => (Array.isArray(a) ? a.map(toNumber) : []);
const matrix = (a) => (Array.isArray(a) ? a.map(numbers) : []);
const list = (a) => (Array.isArray(a) ? a : []);

/** GET a JSON route; throws an Error with the server's message on failure (TensorBoard answers a
 * route's errors as plain text: "Invalid argument: ..." or "Not found: ..."). */
export async function fetchJson(url, { signal } = {}) {
  let res;
  try {
    res = await fetch(url, { signal, headers: { Accept: 'application/json' } });
  } catch (e) {
    if (e.name === 'AbortError') throw e;
    throw new Error(`Could not reach ${url}: ${e.message}`);
  }
  const text = await res.text();
  let body = null;
  try {
    body = text ? JSON.parse(text) : null;
  } catch {
    if (res.ok) throw new Error(`${url} did not answer JSON.`);
  }
  if (!res.ok) {
    const why = body && typeof body.error === 'string' ? body.error : text.trim() || res.statusText;
    throw new Error(`${url} answered ${res.status}: ${why}`);
  }
  return body ?? {};
}

const q = (params) => new URLSearchParams(Object.entries(params).filter(([, v]) => v != null)).toString();

/** The runs that hold replica data, by name. */
export async function fetchRuns(opts) {
  const body = await fetchJson('./runs', opts);
  return list(body.runs).map(runEntry);
}

/** The runs overview: every run and job, worst first (the /runs fields). */
export async function fetchOverview(opts) {
  const body = await fetchJson('./overview', opts);
  return list(body.runs).map(runEntry);
}

function runEntry(r) {
  return {
    run: String(r.run),
    replicas: list(r.replicas),
    devices: list(r.devices),
    source: r.source ?? '',
    first_step: r.first_step ?? null,
    last_step: r.last_step ?? null,
    findings: r.findings ?? {},
    families: list(r.families),
    notes: list(r.notes),
    workers: workerList(r.workers),
    status: statusEntry(r.status),
  };
}

/** A run's status column (`/runs` `status`): `{state, age_s, worst}`, state null for a run
 * written before the status family. */
function statusEntry(s) {
  return { state: s?.state ?? null, age_s: s?.age_s == null ? null : toNumber(s.age_s), worst: s?.worst ?? null };
}

/** Per-worker grouping of a multi-worker job's replica axis ([] for a single-worker run). */
function workerList(workers) {
  return list(workers).map((w) => ({
    run: String(w.run ?? ''),
    name: String(w.name ?? ''),
    task_type: String(w.task_type ?? ''),
    task_index: toNumber(w.task_index),
    worker: toNumber(w.worker),
    replicas: list(w.replicas),
    devices: list(w.devices),
  }));
}

const orNull = (v) => (v == null ? null : toNumber(v));
const frameList = (a) =>
  list(a).map((f) => ({ file: String(f.file ?? ''), line: orNull(f.line), function: String(f.function ?? ''), user: Boolean(f.user) }));

/** An exception of a status end record (class, message, frames, what TensorFlow's text names). */
function exceptionOf(e) {
  if (!e || typeof e !== 'object') return null;
  return {
    class: String(e.class ?? ''),
    module: e.module ?? null,
    message: String(e.message ?? ''),
    first_line: String(e.first_line ?? ''),
    user_frame: e.user_frame ? frameList([e.user_frame])[0] : null,
    frames: frameList(e.frames),
    defined_at: frameList(e.defined_at),
    node: e.node ?? null,
    replicas: list(e.replicas),
    devices: list(e.devices),
    tasks: list(e.tasks),
    unhealthy_tasks: list(e.unhealthy_tasks),
    step: orNull(e.step),
  };
}

/** How a run (or each worker of a job) is going and how it ended (`/status`); state null for a
 * run without status data. */
export async function fetchStatus(run, opts) {
  const body = await fetchJson(`./status?${q({ run })}`, opts);
  const cause = body.root_cause;
  return {
    run: String(body.run ?? run),
    state: body.state ?? null,
    age_s: orNull(body.age_s),
    root_cause: cause ? { ...cause, replicas: list(cause.replicas), step: orNull(cause.step), message: String(cause.message ?? '') } : null,
    workers: list(body.workers).map((w) => ({
      name: String(w.name ?? ''),
      replicas: list(w.replicas),
      state: w.state ?? null,
      step: orNull(w.step),
      completed: orNull(w.completed),
      in_step: w.in_step ?? null,
      last_heartbeat: orNull(w.last_heartbeat),
      age_s: orNull(w.age_s),
      stalled_for_s: orNull(w.stalled_for_s),
      stack: w.stack == null ? null : frameList(w.stack),
      exception: exceptionOf(w.exception),
    })),
    events: list(body.events).map((e) => ({
      wall_time: orNull(e.wall_time),
      worker: e.worker ?? null,
      type: String(e.type ?? ''),
      earlier_process: Boolean(e.earlier_process),
      earlier_stretch: Boolean(e.earlier_stretch),
      summary: String(e.summary ?? ''),
    })),
    earlier_crashes: list(body.earlier_crashes).map((c) => ({ worker: c.worker ?? null, wall_time: orNull(c.wall_time), same_process: Boolean(c.same_process), summary: String(c.summary ?? '') })),
  };
}

/** Step timing of a run: per worker of a multi-worker job, and each replica's ready times
 * (`ready`, null without them; more than `replicaBlocks` replicas come as blocks), non-finite
 * values as JS numbers. */
export async function fetchStepTime(run, maxPoints, opts, replicaBlocks) {
  const body = await fetchJson(`./step_time?${q({ run, max_points: maxPoints, replica_blocks: replicaBlocks })}`, opts);
  return {
    run: String(body.run ?? run),
    workers: workerList(body.workers),
    steps: numbers(body.steps),
    busy: matrix(body.busy),
    lateness: matrix(body.lateness),
    period: matrix(body.period),
    median_busy: numbers(body.median_busy),
    median_lateness: numbers(body.median_lateness),
    downsampled: Boolean(body.downsampled),
    ready: readyTimes(body.ready),
    pss_workers: pssWorkers(body.pss_workers),
  };
}

/** `/step_time`'s `pss_workers`: each worker's totals under ParameterServerStrategy, or null. */
function pssWorkers(p) {
  if (!p || typeof p !== 'object') return null;
  return {
    step: toNumber(p.step),
    steps_run: numbers(p.steps_run),
    busy: numbers(p.busy),
    span: numbers(p.span),
    rate: numbers(p.rate),
    step_seconds: numbers(p.step_seconds),
    stragglers: list(p.stragglers).map(toNumber),
  };
}

/** `/step_time`'s `ready`: each replica's ready seconds per logged step, or null. */
function readyTimes(r) {
  if (!r || typeof r !== 'object') return null;
  return {
    replicas: list(r.replicas),
    devices: list(r.devices).map(String),
    workers: list(r.workers).map(String),
    steps: numbers(r.steps),
    warm_up: Boolean(r.warm_up),
    median: matrix(r.median),
    max: matrix(r.max),
    wait: matrix(r.wait),
    median_ready: numbers(r.median_ready),
    median_wait: numbers(r.median_wait),
    max_ready: numbers(r.max_ready),
    downsampled: Boolean(r.downsampled),
    pooled: blocksOf(r.pooled),
  };
}

/** `pooled` of per-replica series cut to blocks (`replica_blocks`): `{blocks: [[first, last]]}`
 * (replica positions), else null. */
const blocksOf = (value) => (value && Array.isArray(value.blocks) ? { blocks: value.blocks.map((b) => list(b).map(toNumber)) } : null);

/** Per-step, per-replica inputs of one run, non-finite values as JS numbers; the batch sizes of
 * more than `replicaBlocks` replicas come as blocks (`pooled`). */
export async function fetchInputs(run, maxPoints, opts, replicaBlocks) {
  const body = await fetchJson(`./inputs?${q({ run, max_points: maxPoints, replica_blocks: replicaBlocks })}`, opts);
  const batch = matrix(body.batch_size);
  return {
    run: String(body.run ?? run),
    replicas: list(body.replicas),
    devices: list(body.devices),
    strategy: String(body.strategy ?? ''),
    steps: numbers(body.steps),
    batch_size: batch,
    batch_size_min: body.batch_size_min ? matrix(body.batch_size_min) : batch,
    batch_size_max: body.batch_size_max ? matrix(body.batch_size_max) : batch,
    imbalance: numbers(body.imbalance),
    downsampled: Boolean(body.downsampled),
    pooled: blocksOf(body.pooled),
    shape_events: list(body.shape_events).map((ev) => ({
      step: toNumber(ev.step),
      inputs: list(ev.inputs).map((inp) => ({
        name: String(inp.name ?? ''),
        dtypes: list(inp.dtypes),
        shapes: list(inp.shapes),
        mismatch: Boolean(inp.mismatch),
        mismatch_dims: list(inp.mismatch_dims),
      })),
    })),
    workers: workerList(body.workers),
    notes: list(body.notes),
  };
}

export const SEVERITIES = ['error', 'warning', 'info'];
const rank = (s) => {
  const i = SEVERITIES.indexOf(s);
  return i < 0 ? SEVERITIES.length : i;
};

/** Findings of one run, sorted by severity then first step. */
export async function fetchFindings(run, opts) {
  const body = await fetchJson(`./findings?${q({ run })}`, opts);
  return list(body.findings)
    .map((f) => ({
      kind: String(f.kind ?? ''),
      severity: String(f.severity ?? 'info'),
      run: String(f.run ?? run),
      first_step: toNumber(f.first_step),
      last_step: toNumber(f.last_step),
      count: toNumber(f.count),
      replicas: list(f.replicas),
      name: f.name ?? null,
      value: toNumber(f.value),
      threshold: toNumber(f.threshold),
      message: String(f.message ?? ''),
      view: f.view ?? null,
      cause: f.cause ?? null,
      // A finding grouping several of one cause: the grouped findings (name, steps, replicas...).
      items: list(f.items).map((i) => ({
        ...i,
        severity: String(i.severity ?? 'info'),
        first_step: toNumber(i.first_step),
        last_step: toNumber(i.last_step),
        count: toNumber(i.count),
        replicas: list(i.replicas),
        value: toNumber(i.value),
      })),
    }))
    .sort((a, b) => rank(a.severity) - rank(b.severity) || (a.first_step ?? 0) - (b.first_step ?? 0));
}

/** `pooled` of a body cut to blocks (`matrix_side`): `{side, pairs_above_0}`, else null. */
const pooledOf = (value) => (value && typeof value === 'object' ? { side: toNumber(value.side), pairs_above_0: toNumber(value.pairs_above_0) } : null);

/** Random generators per replica of one run (null when the run has none); match matrices of
 * more than `matrixSide` replicas come as blocks (`pooled`). */
export async function fetchRng(run, maxPoints, opts, matrixSide) {
  const body = await fetchJson(`./rng?${q({ run, max_points: maxPoints, matrix_side: matrixSide })}`, opts);
  if (!list(body.generators).length) return null;
  return {
    replicas: list(body.replicas),
    steps: numbers(body.steps),
    logged_steps: toNumber(body.logged_steps),
    downsampled: Boolean(body.downsampled),
    generators: list(body.generators).map((g) => ({
      name: String(g.name ?? ''),
      kind: String(g.kind ?? ''),
      layer: g.layer ?? null,
      layer_class: g.layer_class ?? null,
      mirrored: Boolean(g.mirrored),
      match: matrix(g.match),
      pooled: pooledOf(g.pooled),
      stream_groups: list(g.stream_groups),
      state_groups: list(g.state_groups),
      last_state: list(g.last_state),
      last_fingerprint: list(g.last_fingerprint),
    })),
  };
}

/** Example fingerprints and replica overlaps of one run (null when the run has none); as
 * `fetchRng`, its matrices may come as blocks. */
export async function fetchData(run, maxPoints, opts, matrixSide) {
  const body = await fetchJson(`./data?${q({ run, max_points: maxPoints, matrix_side: matrixSide })}`, opts);
  if (!list(body.steps).length) return null;
  return {
    replicas: list(body.replicas),
    steps: numbers(body.steps),
    total_steps: toNumber(body.total_steps),
    sampled: body.sampled === true,
    share: matrix(body.share),
    steps_shared: matrix(body.steps_shared),
    pooled: pooledOf(body.pooled),
    total_distinct: numbers(body.total_distinct),
    total_duplicated: numbers(body.total_duplicated),
    duplicate_share: matrix(body.duplicate_share),
  };
}

/** Weight drift and placement of one run (see http_api.md `/variables`); the top variables'
 * per-replica series of more than `replicaBlocks` replicas come as blocks (`pooled.blocks`:
 * each block's first and last replica position). */
export async function fetchVariables(run, maxPoints, top, opts, replicaBlocks) {
  const body = await fetchJson(`./variables?${q({ run, max_points: maxPoints, top, replica_blocks: replicaBlocks })}`, opts);
  return {
    run: String(body.run ?? run),
    replicas: list(body.replicas),
    devices: list(body.devices),
    steps: numbers(body.steps),
    exact_steps: numbers(body.exact_steps),
    downsampled: Boolean(body.downsampled),
    tolerance: toNumber(body.tolerance),
    variables: list(body.variables).map((v) => ({
      name: String(v.name ?? ''),
      shape: list(v.shape),
      dtype: v.dtype ?? null,
      trainable: Boolean(v.trainable),
      sync: v.sync ?? '',
      devices: list(v.devices),
      mirrored: Boolean(v.mirrored),
      present: list(v.present).map(Boolean),
      max_rel_l2: toNumber(v.max_rel_l2),
      max_abs: toNumber(v.max_abs),
      max_abs_exact: Boolean(v.max_abs_exact),
      bit_identical: v.bit_identical ?? null,
      first_drift_step: v.first_drift_step ?? null,
    })),
    top: list(body.top).map((t) => ({
      name: String(t.name ?? ''),
      max_rel_l2: numbers(t.max_rel_l2),
      rel_l2: matrix(t.rel_l2),
      max_abs: matrix(t.max_abs),
    })),
    pooled: blocksOf(body.pooled),
    parameter_servers: parameterServers(body.parameter_servers),
    notes: list(body.notes),
  };
}

/** `/variables`' `parameter_servers` (a ParameterServerStrategy run's bytes per ps), or null. */
function parameterServers(p) {
  if (!p || typeof p !== 'object') return null;
  return {
    servers: list(p.servers).map((s) => ({
      ps: toNumber(s.ps),
      device: String(s.device ?? ''),
      bytes: toNumber(s.bytes),
      share: toNumber(s.share),
      variables: toNumber(s.variables),
      largest: s.largest == null ? null : String(s.largest),
      largest_bytes: toNumber(s.largest_bytes),
    })),
    total_bytes: toNumber(p.total_bytes),
    off_ps_bytes: toNumber(p.off_ps_bytes),
    fair_share: toNumber(p.fair_share),
    share_threshold: toNumber(p.share_threshold),
    variables: list(p.variables).map((v) => ({ name: String(v.name ?? ''), ps: v.ps == null ? null : toNumber(v.ps), bytes: toNumber(v.bytes) })),
  };
}

/** Gradient health per replica of one run (./gradients), non-finite values as JS numbers; the
 * series and layer matrix of more than `replicaBlocks` replicas come as blocks (`pooled`). */
export async function fetchGradients(run, maxPoints, step, opts, replicaBlocks) {
  const params = { run, max_points: maxPoints, replica_blocks: replicaBlocks };
  if (step != null) params.step = step;
  const body = await fetchJson(`./gradients?${q(params)}`, opts);
  return {
    run: String(body.run ?? run),
    replicas: list(body.replicas),
    variables: list(body.variables).map(String),
    shapes: list(body.shapes),
    has_loss: Boolean(body.has_loss),
    scaling: String(body.scaling ?? ''),
    steps: numbers(body.steps),
    global_norm: matrix(body.global_norm),
    ratio: matrix(body.ratio),
    loss: matrix(body.loss),
    downsampled: Boolean(body.downsampled),
    layer_step: body.layer_step == null ? null : toNumber(body.layer_step),
    layer_norms: matrix(body.layer_norms),
    layer_ratio: matrix(body.layer_ratio),
    nonfinite: list(body.nonfinite).map((e) => ({
      step: toNumber(e.step),
      grad_nan: numbers(e.grad_nan),
      grad_inf: numbers(e.grad_inf),
      loss_nan: numbers(e.loss_nan),
      loss_inf: numbers(e.loss_inf),
    })),
    batches: list(body.batches).map((b) => ({
      step: toNumber(b.step),
      replica: toNumber(b.replica),
      inputs: list(b.inputs).map((i) => ({
        name: String(i.name),
        dtype: String(i.dtype),
        shape: list(i.shape),
        truncated: Boolean(i.truncated),
        kept_rows: i.kept_rows == null ? null : toNumber(i.kept_rows),
        nonfinite_examples: numbers(i.nonfinite_examples),
      })),
    })),
    pooled: blocksOf(body.pooled),
    notes: list(body.notes),
  };
}

/** Watched values (`/watch`): shape events and stats per leaf and replica. */
export async function fetchWatch(run, maxPoints, opts) {
  const body = await fetchJson(`./watch?${q({ run, max_points: maxPoints })}`, opts);
  const points = (p) => ({
    steps: numbers(p?.steps),
    values: list(p?.values).map((step) => list(step).map((leaf) => list(leaf).map(numbers))),
  });
  return {
    run: String(body.run ?? run),
    replicas: list(body.replicas),
    devices: list(body.devices),
    stat_rows: list(body.stat_rows).map(String),
    values: list(body.values).map((v) => ({
      name: String(v.name),
      leaves: list(v.leaves).map(String),
      shape_events: list(v.shape_events).map((e) => ({ step: toNumber(e.step), explain: Boolean(e.explain), leaves: list(e.leaves) })),
      stats: points(v.stats),
      nonfinite: points(v.nonfinite),
    })),
  };
}
