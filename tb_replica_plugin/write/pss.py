"""ParameterServerStrategy: each worker is a replica of the run, its steps' records written by
the coordinator.

Under `ParameterServerStrategy` a step runs as a closure on one worker (`ClusterCoordinator.
schedule`); the coordinator's summary writer does not exist there. `ReplicaProbe.schedule(fn,
args)` schedules `fn` in a function of its own that returns, beside `fn`'s result, a small record:
the worker it ran on (`experimental_get_current_worker_index`) and what each family's `observe_*`
call put in it while `fn` was traced (`capture`; tensors of the step, a few int64 words). The
coordinator fetches the records of finished steps (at each `schedule` and at `flush`/`close`),
keeps each worker's in the order it ran them, and once every worker ran its k-th step, hands them
to the families' `pss_deliver` at step k: the run's replica r is worker r. A step some worker did
not reach is not written (stragglers); the step_time family counts every step each worker ran and
times them by their start and end (`pss_ran`, `pss_steps`).

Outside a step scheduled through the probe, a probe under this strategy records nothing and says
so once (`refuses`). Families without a `pss_deliver` are refused the same way.
"""

import collections
import itertools
import threading

import numpy as np
import tensorflow as tf

from tb_replica_plugin.write import pss_failures

STRATEGY = "ParameterServerStrategy"
_REFUSAL = (
    "tb_replica_plugin: under ParameterServerStrategy the probe records only observe_inputs "
    "and observe_gradients, inside steps scheduled with probe.schedule(step_fn, args=...) "
    "(in place of coordinator.schedule), and observe_variables (where each variable lives); "
    "this {what} records nothing, training goes on."
)


def is_parameter_server(strategy):
    """True for a `tf.distribute.ParameterServerStrategy` (V1 or V2)."""
    return type(strategy).__name__.startswith(STRATEGY)


class ScheduledValue(tf.distribute.experimental.coordinator.RemoteValue):
    """What `ReplicaProbe.schedule` returns: a `RemoteValue` of the scheduled function's own
    result.

    Wraps the `RemoteValue` of the probe's closure (which also carries the step's record).
    """

    def __init__(self, remote):
        self._remote = remote

    def fetch(self):
        """The function's result as numpy values (blocks until the step ran)."""
        return self._remote.fetch()[0]

    def get(self):
        """The function's result as tensors (blocks until the step ran)."""
        return self._remote.get()[0]


class _State:
    def __init__(self):
        self.lock = threading.RLock()
        self.capturing = None  # {family: (meta, tensors)} while a scheduled function traces
        self.building = False
        self.functions = {}  # id(fn) -> (fn, wrapped tf.function)
        self.traces = {}  # trace id -> {family: meta}
        self.trace_ids = itertools.count(1)
        self.pending = collections.deque()  # RemoteValues of steps not harvested yet
        self.per_worker = collections.defaultdict(collections.deque)  # worker -> [StepRecord]
        self.next_step = 0
        self.failed = 0  # closures that failed (the coordinator raises them to the caller)
        self.watched = []  # variables observed in steps traced since handed on


class ParameterServer:
    """`ProbeCore`'s part for `ParameterServerStrategy` (a mixin; state made on first use)."""

    def _pss(self):
        state = self.__dict__.get("_pss_state")
        if state is None:
            state = self.__dict__["_pss_state"] = _State()
        return state

    def pss_static(self, strategy):
        """The static fields a run under this strategy adds (`{"strategy": ...}`), else {}."""
        return {"strategy": STRATEGY} if is_parameter_server(strategy) else {}

    def pss_refuses(self, what="call"):
        """Whether `build` must refuse: under this strategy outside the probe's own build in
        `schedule` (warns once).

        Args:
          what: the words for what records nothing.
        """
        if not is_parameter_server(self.strategy) or self._pss().building:
            return False
        self.warn_once("pss", _REFUSAL.format(what=what))
        return True

    def pss_build(self):
        """`build()` for the probe's own use under this strategy (no refusal): False when the
        probe cannot record."""
        state = self._pss()
        state.building = True
        try:
            return self.build()
        finally:
            state.building = False

    def pss_continue_from(self, step):
        """The first step a probe that has written none yet writes (a new callback's probe
        continuing a model's steps)."""
        state = self._pss()
        with state.lock:
            if state.next_step == 0 and not any(state.per_worker.values()):
                state.next_step = int(step)

    def pss_next_step(self):
        """The step after every step a worker ran so far (written or not)."""
        state = self._pss()
        with state.lock:
            return state.next_step + max((len(q) for q in state.per_worker.values()), default=0)

    def pss_capturing(self):
        """True while a function given to `schedule` is traced (a family then `capture`s)."""
        return self.__dict__.get("_pss_state") is not None and self._pss().capturing is not None

    def pss_variables_seen(self, variables, step=None):
        """`observe_variables` under this strategy: hands `variables` to the families'
        `pss_variables` (the coordinator's placement), now on the coordinator, after the
        `schedule` call inside a step being traced.

        Args:
          variables: the variables (an iterable).
          step: the step to record at (None: the next step the coordinator writes).

        Returns:
          False when the strategy is not a `ParameterServerStrategy` (record as usual).
        """
        if not is_parameter_server(self.strategy):
            return False
        state = self._pss()
        state.watched.extend(variables)
        if state.capturing is None:
            self._pss_hand_variables(step)
        return True

    def _pss_hand_variables(self, step=None):
        """The variables seen since the last call, to every recorder's `pss_variables`."""
        state = self._pss()
        if not state.watched:
            return
        built = self.pss_build()
        variables, state.watched = state.watched, []
        if not built:
            return
        step = state.next_step if step is None else int(step)
        for recorder in self.recorders():
            hand = getattr(recorder, "pss_variables", None)
            if hand is not None:
                hand(variables, step)

    def pss_capture(self, family, meta, tensors):
        """Puts a family's values of this step in the step's record (while tracing).

        Args:
          family: the family's name (one call per step: a second one is ignored with a warning).
          meta: what the coordinator needs to read them, known when tracing (any object).
          tensors: a dict of tensors of the scheduled function's graph.
        """
        capture = self._pss().capturing
        if family in capture:
            self.warn_once(
                f"pss_twice_{family}",
                f"tb_replica_plugin: {family} observed twice in one scheduled step; only the "
                "first call is recorded (one step per scheduled call).",
            )
            return
        capture[family] = (meta, dict(tensors))

    def schedule(self, fn, args=None, kwargs=None):
        """Schedules one training step on a worker and records it (`ParameterServerStrategy`).

        Use it in place of `coordinator.schedule(fn, args=..., kwargs=...)`: `fn` (a
        `tf.function` or a Python function) runs as the coordinator would run it, and what its
        `observe_inputs` and `observe_gradients` calls record comes back with the step;
        `observe_variables` in it is handed on when it is traced (other `observe_*` calls
        record nothing under this strategy and warn once). Each
        worker is one replica of the run (replica r: worker r); the step axis counts each
        worker's steps (step k: every worker's k-th step), written once every worker ran it.

        Args:
          fn: the step function (its `tf.function` options are not kept: it is traced inside
            the probe's own `tf.function`).
          args, kwargs: as for `ClusterCoordinator.schedule` (e.g. a per-worker iterator).

        Returns:
          A `ScheduledValue`: `fetch()` and `get()` give `fn`'s result, as the coordinator's
          `RemoteValue` would.

        Raises:
          ValueError: if the strategy is not a `ParameterServerStrategy` or has no
            `ClusterCoordinator`.
        """
        strategy = self.strategy
        coordinator = getattr(strategy, "_cluster_coordinator", None)
        if not is_parameter_server(strategy) or coordinator is None:
            raise ValueError(
                "probe.schedule needs a ParameterServerStrategy with a ClusterCoordinator: "
                "create tf.distribute.coordinator.ClusterCoordinator(strategy) first, and give "
                "the probe that strategy"
            )
        state = self._pss()
        built = self.pss_build()
        if not built:
            return ScheduledValue(_Plain(coordinator.schedule(fn, args=args, kwargs=kwargs)))
        pss_failures.watch(self, coordinator)  # the worker failures the coordinator handles
        remote = coordinator.schedule(self._pss_wrapped(fn), args=args, kwargs=kwargs)
        with state.lock:
            state.pending.append(remote)
        self._pss_hand_variables()  # variables observed in a new trace: their placement
        self.pss_harvest(block=False)
        return ScheduledValue(remote)

    def _pss_wrapped(self, fn):
        state = self._pss()
        entry = state.functions.get(id(fn))
        if entry is not None and entry[0] is fn:
            return entry[1]
        python_fn = getattr(fn, "python_function", fn)

        def scheduled(*args, **kwargs):
            return self.pss_recorded(python_fn, *args, **kwargs)

        wrapped = tf.function(scheduled)
        state.functions[id(fn)] = (fn, wrapped)
        return wrapped

    def pss_recorded(self, python_fn, *args, **kwargs):
        """Inside a function being traced for a worker: runs `python_fn(*args, **kwargs)` (one
        step) with the families' `observe_*` calls captured, and returns `(result, record)`:
        the step's record, one int64 vector (one copy to the coordinator).

        The record: a header (`HEADER` words: the trace's id, the worker, the step's start and
        end on the worker's clock, float64 seconds bit-cast), then each captured value's length
        and words. Records of several steps may be concatenated (`_records`).
        """
        state = self._pss()
        trace = next(state.trace_ids)
        start = tf.timestamp()
        state.capturing = {}
        try:
            with tf.control_dependencies([start]):
                result = python_fn(*args, **kwargs)
            capture = state.capturing
        finally:
            state.capturing = None
        state.traces[trace] = _layout(capture)
        worker = tf.distribute.coordinator.experimental_get_current_worker_index()
        pieces = []
        for _, (_, values) in sorted(capture.items()):
            for key in sorted(values):
                value = tf.reshape(tf.cast(values[key], tf.int64), [-1])
                pieces += [tf.reshape(tf.size(value, out_type=tf.int64), [1]), value]
        outputs = [t for t in tf.nest.flatten(result) if isinstance(t, tf.Tensor)]
        with tf.control_dependencies(outputs + pieces):
            end = tf.timestamp()
        header = [
            tf.constant([trace], tf.int64),
            tf.reshape(tf.cast(worker, tf.int64), [1]),
            tf.bitcast(tf.reshape(start, [1]), tf.int64),
            tf.bitcast(tf.reshape(end, [1]), tf.int64),
        ]
        return result, tf.concat(header + pieces, axis=0)

    def pss_execution(self, step_fn, steps):
        """A `tf.function(*args)` running `step_fn(*args)` (one step, a Python function) `steps`
        times on a worker, each step recorded (`pss_recorded`): returns `(the last step's result,
        the steps' records one after another)`. For a trainer that schedules it itself (tf_keras
        `fit`, `keras.pss_fit`); its `RemoteValue`s go to `pss_submit`.

        Args:
          step_fn: one training step.
          steps: steps per call (an int >= 1; a `tf.while_loop` beyond the first).
        """

        def execution(*args):
            result, record = self.pss_recorded(step_fn, *args)
            if steps == 1:
                return result, record
            records = tf.TensorArray(tf.int64, size=steps, infer_shape=False).write(0, record)

            def body(index, result, records):
                result, record = self.pss_recorded(step_fn, *args)
                return index + 1, result, records.write(index, record)

            _, result, records = tf.while_loop(
                lambda index, *_: index < steps, body, (tf.constant(1), result, records)
            )
            return result, records.concat()

        return tf.function(execution)

    def pss_submit(self, remote):
        """Coordinator side: the `RemoteValue` of a scheduled `pss_execution` call, whose records
        are read once it ran (and the finished ones now)."""
        state = self._pss()
        with state.lock:
            state.pending.append(remote)
        coordinator = getattr(self.strategy, "_cluster_coordinator", None)
        if coordinator is not None:
            pss_failures.watch(self, coordinator)  # the worker failures the coordinator handles
        self.pss_harvest(block=False)

    def pss_harvest(self, block):
        """Coordinator side: reads the records of finished steps and writes every step all
        workers ran. A failure warns once; training goes on.

        Args:
          block: wait for every scheduled step (flush, close); else take the finished ones.
        """
        state = self.__dict__.get("_pss_state")
        if state is None or self._core is None:
            return
        with self.host_lock, state.lock:
            try:
                self._pss_take(state, block)
                self._pss_write(state)
            except Exception as error:  # noqa: BLE001 - must never break training
                self.warn_failed("pss", error, "the parameter-server steps")

    def _pss_take(self, state, block):
        kept = collections.deque()
        while state.pending:
            remote = state.pending.popleft()
            if not block and not _ready(remote):
                kept.append(remote)
                continue
            try:
                _, record = remote.fetch()
            except Exception:  # noqa: BLE001 - the closure failed: the coordinator raises it
                state.failed += 1
                continue
            steps = _records(state.traces, record)
            for step in steps:
                state.per_worker[step.worker].append(step)
            self._pss_step_time("pss_ran", steps)
        state.pending = kept

    def _pss_write(self, state):
        workers = self.num_replicas
        while all(state.per_worker[w] for w in range(workers)):
            step = state.next_step
            rows = [state.per_worker[w].popleft() for w in range(workers)]
            self._pss_step_time("pss_steps", rows, step)
            families = {}
            for worker, row in enumerate(rows):
                for name, item in row.values.items():
                    families.setdefault(name, [None] * workers)[worker] = item
            for name, per_worker in families.items():
                if any(item is None for item in per_worker):
                    continue  # a family some worker did not observe at this step
                try:
                    self.recorder(name).pss_deliver(per_worker, step)
                except Exception as error:  # noqa: BLE001 - the other families go on
                    self.warn_failed(name, error)
            state.next_step = step + 1

    def _pss_step_time(self, method, *args):
        """The step_time family's `method` (each step's start and end: `families/step_time/
        pss.py`); a failure warns once, the other families go on."""
        recorder = self._recorders.get("step_time")
        if recorder is None:
            return
        try:
            getattr(recorder, method)(*args)
        except Exception as error:  # noqa: BLE001 - the other families go on
            self.warn_failed("step_time", error)


def _layout(capture):
    """`{family: (meta, sorted keys)}` of a trace's capture: how its record vector is read."""
    return {name: (meta, sorted(values)) for name, (meta, values) in capture.items()}


HEADER = 4  # trace, worker, start, end (`pss_recorded`)

StepRecord = collections.namedtuple("StepRecord", "trace worker start end values")
StepRecord.__doc__ = """One worker's step, read on the coordinator: its trace and worker, its start
and end (seconds on the worker's clock) and `{family: (meta, {key: int64 array})}`."""


def _records(traces, record):
    """The `StepRecord`s of one fetched record vector (one step, or an execution's steps one
    after another); a record of an unknown trace ends the reading."""
    steps, offset = [], 0
    while offset < len(record):
        trace, worker = int(record[offset]), int(record[offset + 1])
        start, end = record[offset + 2 : offset + 4].view(np.float64)
        layout = traces.get(trace)
        if layout is None:
            break
        values, offset = _unpack(layout, record, offset + HEADER)
        steps.append(StepRecord(trace, worker, float(start), float(end), values))
    return steps


def _unpack(layout, record, offset):
    """`({family: (meta, {key: int64 array})}, end offset)` of one step's values in `record`
    from `offset` (numpy)."""
    unpacked = {}
    for name, (meta, keys) in sorted(layout.items()):
        values = {}
        for key in keys:
            size = int(record[offset])
            values[key] = record[offset + 1 : offset + 1 + size]
            offset += 1 + size
        unpacked[name] = (meta, values)
    return unpacked, offset


class _Plain:
    """A `RemoteValue` as `ScheduledValue` reads the probe's (a pair: result, record)."""

    def __init__(self, remote):
        self._remote = remote

    def fetch(self):
        return self._remote.fetch(), None

    def get(self):
        return self._remote.get(), None


def _ready(remote):
    """Whether a `RemoteValue` is done (without waiting); False when it cannot be told."""
    event = getattr(remote, "_status_available_event", None)
    return bool(event is not None and event.is_set())
