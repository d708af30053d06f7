"""ReplicaCallback: the probe wired into Keras `fit` with no change to model code.

Keras calls `set_model` before `fit` builds its train function, so the callback wraps the model's
`train_step` there (an instance attribute, so subclasses that override `train_step` are wrapped
too) and Keras traces the instrumented step once. The wrapped step runs inside `strategy.run`,
where the batch is the replica's local batch. The traced train function is kept and handed back
to the next `fit` of the same model with the same callback (no retrace). `on_train_end` restores
the model (and `on_test_end`/`on_predict_end` outside training, for `evaluate`/`predict`).

One implementation serves Keras 3 and tf_keras (Keras 2): the base class is the `Callback` of the
Keras that `tf.keras` means in this process, and every call that differs between the two goes
through `keras.compat` (see there).

`fit` does not call `on_train_end` when it raises (an error in a step, KeyboardInterrupt, another
callback raising), so the model is restored on two more paths: the train function is wrapped so
that any exception escaping a step restores the model and flushes before it propagates, and the
model's `make_train_function` is wrapped so that the next `fit` (or `train_on_batch`) without this
callback after a failure gets the original train function back before it starts. A fit that
stopped outside its step (another callback raised, or Ctrl-C landed between steps) and whose
exception the script caught is recorded as not finished: the status family ends its stretch
"crashed" (or "interrupted" when a SIGINT arrived) at the next fit, at `close` or at exit
(`families/status/record.py`).

Each family's fit-time code is its own (`Recorder.fit_step`, `fit_begin`, `fit_epoch_begin`,
`fit_epoch_end`, called for every recorder of the registry): it installs its hooks through a
`keras.hooks.Fit` (the gradients family wraps the optimizer *instance*'s `apply_gradients`/`apply`,
where it all-reduces, and the model instance's `compute_loss`, to see each replica's loss). This
module names no family.
"""

import contextlib
import os
import traceback
import warnings

import tensorflow as tf

from tb_replica_plugin.core import nest
from tb_replica_plugin.keras import compat, pss_fit
from tb_replica_plugin.keras.hooks import Fit, LossCapture
from tb_replica_plugin.probe import (
    DEFAULT_BUDGET,
    DEFAULT_CAPTURE_BYTES,
    DEFAULT_CAPTURE_LIMIT,
    DEFAULT_EXAMPLES_EVERY,
    DEFAULT_FLUSH_SECS,
    DEFAULT_STALL_SECS,
    ReplicaProbe,
    check_budget,
    check_capture,
    check_examples_every,
    check_flush_secs,
    check_stall_secs,
    check_update_freq,
)
from tb_replica_plugin.write import halt

# Set on the model by an instrumented fit: its probe's step axis (`write.steps`), where the next
# fit of the model, with this callback or another, continues the steps.
STEP_AXIS_ATTR = "_tb_replica_step_axis"
# Set on the model while a ReplicaCallback's hooks are installed: that callback.
INSTALLED_ATTR = "_tb_replica_installed_by"


class ReplicaCallback(*compat.callback_bases()):
    """Keras callback that records, per replica and step, what each replica of `fit` is fed.

    Add it to `model.fit(..., callbacks=[...])` for a model built under a `tf.distribute`
    strategy (or none). For every training step and every replica it records the batch size and
    the shape and dtype of every input leaf (x, y, sample weights; nested dicts and tuples), and
    each replica's local gradients before the all-reduce (global and per-variable norms of the
    gradient of the replica's own loss, the loss, and NaN/Inf at every step), to the TensorBoard
    run `log_dir/run_name`, shown by the "Replicas" tab.

    Works with Keras 3 and tf_keras models alike (docs/compatibility.md). Under
    `ParameterServerStrategy` (tf_keras `fit`) each worker is a replica of the run and only the
    inputs, gradients and variable placement are recorded (`keras.pss_fit`). Under a strategy
    it cannot instrument (`TPUStrategy`; Keras 3 under `ParameterServerStrategy`) it warns once
    at `on_train_begin` and records nothing; training goes on.

    Args:
      log_dir: the log directory, as for `keras.callbacks.TensorBoard` (the same one may be
        shared with it).
      run_name: sub-directory of `log_dir` this callback writes, i.e. the TensorBoard run name.
      update_freq: `"epoch"` (default), `"batch"` or an integer N: how often the dense
        batch-size series is written (every epoch end, every step, every N steps). Shape and
        dtype changes, and so every odd batch, are written at the step they happen whatever this
        is; the dense series keeps the per-window minimum and maximum of every replica. The
        rng and data families are written at the same frequency, and the weight-drift check
        runs at these logged steps (at each epoch end, or every N steps).
      gradients: record each replica's local gradient norms, loss and NaN/Inf before the
        all-reduce (default True; the NaN/Inf check runs at every step). See
        `ReplicaProbe.observe_gradients`.
      rng: record the random generators per replica (default True): every Keras
        `SeedGenerator` of the model's layers (Dropout's, for instance), the generators given
        in `generators`, and the global generators that exist. See `ReplicaProbe.observe_rng`.
      generators: extra generators to observe (a dict `{name: tf.random.Generator}` or
        anything `ReplicaProbe.observe_rng` accepts).
      examples: record a fingerprint of every example each replica is fed, and which replicas
        got the same examples (default True). See `ReplicaProbe.observe_examples`.
      examples_every: the examples are fingerprinted and compared at every this many steps and
        at every logged step (each epoch's last step with `update_freq="epoch"`), not at the
        others (default 16; 1: every step). Written windows count sampled steps only. A pipeline
        that is never sharded duplicates at every step, so sampling finds it; a duplication
        confined to steps that are not sampled is missed.
      variables: record weight drift and placement of every model and optimizer variable
        (default True): at each logged step, each copy is fingerprinted on its own device (no
        variable is copied across devices). See `ReplicaProbe.observe_variables`.
      variables_exact: also compute the exact element-wise difference of every copy from
        replica 0's at logged steps (copies each variable to replica 0's device; default False).
      variables_budget: with an integer `update_freq`, about how many elements per replica the
        drift check of a logged step reads (default 32,768): variables of more than 4,096
        elements are cut into P slices (P = their total size / budget, rounded up), logged
        check i reads slice i mod P of each, and epoch ends add the full check; so every
        element is checked once every P logged steps and at full checks, and a check's cost
        does not grow with the model. None: the full check at every logged step. With either
        `update_freq`, the full checks at epoch ends are at least P steps apart (an epoch end
        sooner skips it; the end of training always checks), so their cost stays near the
        budget per step too; None: every epoch end. `variables_exact=True`: every check full.
      flush_secs: seconds between background flushes of the event file (default 5). The file
        is also flushed at every epoch end, at the end of training and when `fit` raises.
      outputs: record each replica's model outputs (`y_pred`, as the model's `compute_loss`
        receives it; a dict of outputs per output name) as the watched value `outputs`
        (default True): shapes at every change, NaN/Inf at every step, small stats at sampled
        steps. See `ReplicaProbe.watch`.
      halt_on: None (default: record only), "error" (every finding of severity error) or a list
        of finding kinds (docs/findings.md): such a finding stops `fit` like Keras's
        `EarlyStopping` (`model.stop_training`), printed once with replica, step and cause
        (and kept in `callback.stopped_by`, a list of `analysis.Finding`).
        `nonfinite_gradients` stops at the end of the step where it happens; the other kinds
        at their checks (each logged step with an integer `update_freq`, else each epoch end).
        Costs a read of a small host variable after each step (and keeps Keras from
        dispatching batch-end callbacks asynchronously). See docs/halting.md.
      capture_limit: at most this many faulty steps have their culprit batches captured
        (default 3; 0: none): at the first step of a run of steps where some replica's
        gradients or loss are not finite, the local batch of each such replica is written
        (`tb-replica export-batch`). Clean steps pay nothing.
      capture_bytes: bytes kept per captured replica batch (default 4 MB, shared evenly by its
        input leaves; a larger leaf keeps its first rows and the header says so).
      heartbeat: write a heartbeat every `flush_secs` (default True), so a hang or a killed
        process shows; how `fit` ends (returned, raised on a replica, stopped by `halt_on`) is
        recorded either way. See `ReplicaProbe` and docs/status.md.
      stall_secs: after this many seconds without progress the heartbeat also writes every
        thread's Python stack, once per stall (default 60; `SIGUSR1` asks for them at once);
        recorded in the start event, the reader calls the run `stalled` after the same time
        unless told another (`Thresholds.stall_seconds`).

    Nothing here can stop training: a failure to trace the collectors, to create or write the log
    dir (unwritable, removed while training, full disk) warns once (`RuntimeWarning`) and
    recording stops; the model is restored even when `fit` raises.

    Raises:
      ValueError: if `update_freq` is not "epoch", "batch" or a positive integer, `flush_secs`
        is not a positive number, `examples_every` not a positive integer, `halt_on` not None,
        "error" or a list of known finding kinds, `capture_limit`/`capture_bytes` invalid, or
        `variables_budget` neither None nor a positive integer.

    Example:
      ```python
      strategy = tf.distribute.MirroredStrategy()
      with strategy.scope():
          model = make_model()
          model.compile(optimizer="adam", loss="mse")
      model.fit(dataset, epochs=3,
                callbacks=[tb_replica_plugin.ReplicaCallback("logs")])
      # tensorboard --logdir logs  → "Replicas" tab, run "replicas"
      ```
    """

    def __init__(
        self,
        log_dir="logs",
        run_name="replicas",
        update_freq="epoch",
        flush_secs=DEFAULT_FLUSH_SECS,
        gradients=True,
        rng=True,
        generators=None,
        examples=True,
        variables=True,
        variables_exact=False,
        variables_budget=DEFAULT_BUDGET,
        examples_every=DEFAULT_EXAMPLES_EVERY,
        outputs=True,
        halt_on=None,
        capture_limit=DEFAULT_CAPTURE_LIMIT,
        capture_bytes=DEFAULT_CAPTURE_BYTES,
        heartbeat=True,
        stall_secs=DEFAULT_STALL_SECS,
    ):
        super().__init__()
        self.halt_on = halt.resolve_halt_on(halt_on)
        check_capture(capture_limit, capture_bytes)
        check_stall_secs(stall_secs)
        self.heartbeat = bool(heartbeat)
        self.stall_secs = stall_secs
        self.capture_limit = capture_limit
        self.capture_bytes = capture_bytes
        if self.halt_on is not None:
            # Only then a batch-end hook (Keras dispatches batch ends synchronously for it).
            self.on_train_batch_end = self._halt_at_batch_end
        check_update_freq(update_freq, ("epoch", "batch"))
        self.log_dir = os.fspath(log_dir)
        self.run_name = run_name
        self.update_freq = 1 if update_freq == "batch" else update_freq
        check_flush_secs(flush_secs)
        self.flush_secs = flush_secs
        check_examples_every(examples_every)
        self.examples_every = examples_every
        self.gradients = bool(gradients)
        self.rng = rng
        self.generators = generators
        self.examples = examples
        self.variables = bool(variables)
        self.variables_exact = bool(variables_exact)
        check_budget(variables_budget)
        self.variables_budget = variables_budget
        self.outputs = bool(outputs)
        self._probe = None
        self._patched = None
        self._undo_hooks = []
        self._armed = False  # set_model ran: the next make_train_function is this fit's
        self._training = False
        # set_model ran since the last on_train_begin: the callbacks of a new fit, evaluate or
        # predict (fit's own validation reuses fit's callbacks: no set_model).
        self._new_callbacks = False
        self._traced = None  # (what it depends on, the instrumented train function)
        self._fit = None  # the families' view of the instrumented fit (`keras.hooks.Fit`)
        self._batches = LossCapture()  # the step's named batch, for the culprit capture
        self.stopped_by = []  # the findings that stopped the last fit (halt_on)
        self._steps_per_call = 1
        self._pss = False  # tf_keras fit under ParameterServerStrategy (`keras.pss_fit`)

    @property
    def probe(self):
        """The `ReplicaProbe` this callback writes with (None before training starts)."""
        return self._probe

    # ----------------------------------------------------------------- Keras hooks

    def set_model(self, model):
        """Instruments `model` before `fit` builds its train function (Keras calls this first).

        `fit` builds its `CallbackList` (so this runs) *before* `make_train_function`, so the
        instrumented step is traced once, by Keras itself. The traced train function is kept and
        handed back to the next `fit` of the same model with this callback: no retrace.
        """
        super().set_model(model)
        self._new_callbacks = True
        try:
            if compat.strategy_refusal(model.distribute_strategy, model):
                return  # warned at on_train_begin, where fit is known to train
            self._install(model)
        except Exception as error:  # noqa: BLE001 - never break the training it watches
            warnings.warn(
                "tb_replica_plugin: ReplicaCallback could not instrument the train step, "
                f"training goes on without it: {type(error).__name__}: {error}",
                RuntimeWarning,
                stacklevel=2,
            )
            self._restore(model)

    def on_train_begin(self, logs=None):
        strategy = self.model.distribute_strategy
        refusal = compat.strategy_refusal(strategy, self.model)
        if refusal:
            warnings.warn(
                f"tb_replica_plugin: ReplicaCallback records nothing in this fit, {refusal}.",
                RuntimeWarning,
                stacklevel=2,
            )
            return
        self._new_callbacks = False
        if self._patched is None:
            return  # instrumenting failed (warned at set_model)
        self._training = True
        self.stopped_by = []
        try:
            if self._pss:
                pss_fit.begin(self._probe, self.model)
            else:
                self._probe.set_step(self._initial_step())
                self.model.__dict__[STEP_AXIS_ATTR] = self._probe.step_axis
            self._probe.begin_run("fit")
            self._steps_per_call = compat.steps_per_execution(self.model)
            self._fit_hooks("fit_begin")
        except Exception as error:  # noqa: BLE001 - never break the training it watches
            warnings.warn(
                "tb_replica_plugin: ReplicaCallback could not start recording, training goes "
                f"on without it: {type(error).__name__}: {error}",
                RuntimeWarning,
                stacklevel=2,
            )
            self._restore(self.model)

    def on_epoch_begin(self, epoch, logs=None):
        steps = (self.params or {}).get("steps")
        if steps and self._probe is not None and self._patched is not None and not self._pss:
            # The last step of each epoch is sampled (its partial batch, the window's end).
            self._probe.sample_last_of(steps)
        self._fit_hooks("fit_epoch_begin")

    def on_epoch_end(self, epoch, logs=None):
        if self._probe is not None:
            self._fit_hooks("fit_epoch_end")
            self._probe.flush(window=self.update_freq == "epoch")
            if self.halt_on is not None and self._patched is not None:
                self._halt(at_check=True)

    def on_train_end(self, logs=None):
        self._fit_hooks("fit_epoch_end", final=True)
        self._finish(self.model, returned=True)

    def on_test_begin(self, logs=None):
        self._end_unreturned_fit("evaluate")

    def on_predict_begin(self, logs=None):
        self._end_unreturned_fit("predict")

    def _end_unreturned_fit(self, how):
        """`evaluate`/`predict` with this callback after a `fit` that stopped without returning
        (an exception left it between two steps and the script caught it): that fit's stretch
        ends, recorded as such, and the model is restored. `fit`'s own validation (fit's
        callbacks, no set_model since `on_train_begin`) leaves training alone."""
        if self._training and self._new_callbacks:
            self._finish(self.model, how=how)

    def on_test_end(self, logs=None):
        # `evaluate`/`predict` with this callback also call set_model; `fit`'s validation runs
        # inside training (keep the instrumentation then).
        if not self._training:
            self._restore(self.model)

    def on_predict_end(self, logs=None):
        if not self._training:
            self._restore(self.model)

    def _halt_at_batch_end(self, batch, logs=None):
        """After each step (only with `halt_on`): stop on a fault of this step or check."""
        probe = self._probe
        if probe is None or self._patched is None or self.model.stop_training:
            return
        at_check = False
        if isinstance(self.update_freq, int) and probe.watches_checks:
            step = probe.step_axis.current()
            at_check = step is not None and step % self.update_freq == 0
        self._halt(at_check)

    def _halt(self, at_check):
        """Stops `fit` (`model.stop_training`) when the probe's run holds a watched fault."""
        try:
            found = self._probe.faults(check=at_check)
        except Exception as error:  # noqa: BLE001 - never break the training it watches
            self._probe.warn_failed("halt", error, "the halt_on check")
            return
        if found:
            self.model.stop_training = True
            self.stopped_by = found
            for finding in found:
                print(f"ReplicaCallback: stopping training: {halt.describe(finding)}")

    def _finish(self, model, error=None, returned=False, how="fit"):
        """Restores the model and writes what was recorded: at train end (`returned`), when a
        step raised `error` (recorded as how the fit ended, at the step it was raised at), or
        when the next fit (or `evaluate`/`predict`: `how`) finds the hooks of a fit that neither
        returned nor saw an exception in its step (recorded as such: `RunEnd.unreturned`).

        The next fit continues the steps from the probe's step axis (`STEP_AXIS_ATTR`).
        """
        self._training = False
        try:
            self._restore(model)
        finally:
            if self._probe is not None:
                unreturned = error is None and not returned
                step = self._probe.host_steps[0] if error is not None or unreturned else None
                context = traceback.extract_stack()[:-2] if error is not None else ()
                self._probe.end_run(
                    how, error, step, self.stopped_by, context, unreturned=unreturned
                )
                if self._pss:
                    pss_fit.end(self._probe, model)

    # ------------------------------------------------------------------ helpers

    def _fit_hooks(self, hook, **kwargs):
        """Calls `hook` (`Recorder.fit_begin`, `fit_epoch_begin`, `fit_epoch_end`) of every
        family's recorder while the model is instrumented; one that raises warns once."""
        if self._probe is None or self._patched is None:
            return
        if self._pss:  # only the families' own hook for this strategy (`keras.pss_fit`)
            if hook != "fit_epoch_end":
                return
            hook = "pss_fit_epoch_end"
        for recorder in self._probe.recorders():
            try:
                getattr(recorder, hook)(self._fit, **kwargs)
            except Exception as error:  # noqa: BLE001 - never break the training it watches
                self._probe.warn_failed(recorder.name, error)

    def _initial_step(self):
        """Where this fit's steps start: a second `fit` of the same model continues the axis.

        The optimizer's `iterations` (so that a model restored from a checkpoint continues
        too), but never below the step after the last one the model's last instrumented fit
        recorded (its probe's step axis): Keras 3's loss-scale optimizer does not count the
        overflow steps it skips, so under mixed precision `iterations` falls behind the steps
        `fit` ran.
        """
        iterations = compat.optimizer_iterations(self.model) or 0
        axis = self.model.__dict__.get(STEP_AXIS_ATTR)
        current = axis.current() if axis is not None else None
        return max(iterations, 0 if current is None else current + 1)

    def _traced_key(self, model):
        """What the kept train function depends on besides the model: a recompiled model (new
        optimizer or loss) or another `steps_per_execution` needs a new trace."""
        return (
            id(model),
            id(getattr(model, "optimizer", None)),
            id(getattr(model, "_compile_loss", getattr(model, "compiled_loss", None))),
            getattr(model, "steps_per_execution", 1),
            bool(getattr(model, "run_eagerly", False)),
        )

    def _install(self, model):
        """Wraps `train_step`, the gradient hooks and `make_train_function` (instance
        attributes) so that the train function Keras builds next is the instrumented one."""
        owner = model.__dict__.get(INSTALLED_ATTR)
        if owner is self and self._patched is not None:
            self._armed = True  # a fit after a failed one: still instrumented
            return
        if owner is not None and owner is not self:
            owner._finish(model)  # another ReplicaCallback left its hooks (its fit failed)
        if self._probe is None:
            self._probe = self._make_probe(model)
        self._pss = pss_fit.applies(model)
        self._build_before_trace(model)
        self._patch_step(model)
        self._armed = True
        traced = self._traced
        if self._pss:  # the kept execution is reused by `make_train_function` (`pss_fit`)
            traced = None
        # Keras reuses `model.train_function` when set: ours if this model was traced with this
        # callback before, else none (a train function built without the probe is not reused).
        if traced is not None and traced[0] == self._traced_key(model):
            model.train_function = self._guarded(model, traced[1])
        else:
            model.train_function = None
        self._wrap_make_train_function(model)

    def _make_probe(self, model):
        """The `ReplicaProbe` of this callback's run, for `model`'s strategy."""
        return ReplicaProbe(
            os.path.join(self.log_dir, self.run_name),
            strategy=model.distribute_strategy,
            update_freq=None if self.update_freq == "epoch" else self.update_freq,
            source="fit",
            flush_secs=self.flush_secs,
            examples_every=self.examples_every,
            halt_on=self.halt_on,
            capture_limit=self.capture_limit,
            capture_bytes=self.capture_bytes,
            heartbeat=self.heartbeat,
            stall_secs=self.stall_secs,
        )

    def _build_before_trace(self, model):
        """The probe's state (and a tf_keras optimizer's slots) exist before Keras traces the
        step: variables created during a first trace would make TensorFlow trace it twice."""
        if self._pss:
            self._probe.pss_build()  # no refusal: the probe records in the workers' steps
        else:
            self._probe.build()
        try:
            compat.build_optimizer_before_trace(model)
        except Exception as error:  # noqa: BLE001 - the optimizer then builds in the step
            self._probe.warn_once(
                "optimizer_build",
                "tb_replica_plugin: could not build the tf_keras optimizer before tracing, so "
                f"fit traces its step twice: {type(error).__name__}: {error}",
            )

    def _patch_step(self, model):
        """Replaces `model.train_step` by the instrumented one and installs the hooks (XLA off:
        an XLA-compiled step cannot write summaries)."""
        had_own = "train_step" in model.__dict__
        self._patched = (had_own, model.__dict__.get("train_step"), model.jit_compile)
        object.__setattr__(model, INSTALLED_ATTR, self)
        if model.jit_compile:
            warnings.warn(
                "tb_replica_plugin: summaries cannot be written from XLA-compiled steps; "
                "ReplicaCallback turns `jit_compile` off for this fit.",
                RuntimeWarning,
                stacklevel=4,
            )
            model.jit_compile = False
        self._fit = Fit(self, model, self._undo_hooks)
        if self._pss:
            # tf_keras hands callbacks RemoteValues (and refuses batch hooks without this).
            self._supports_tf_logs = True
            steps = [recorder.pss_fit_step(self._fit) for recorder in self._probe.recorders()]
            befores = [before for before, _ in steps if before is not None]
            model.train_step = pss_fit.instrumented_step(self, model.train_step, befores)
            return
        steps = [recorder.fit_step(self._fit) for recorder in self._probe.recorders()]
        model.train_step = self._instrumented_step(model.train_step, steps)

    def _wrap_make_train_function(self, model):
        """`model.make_train_function` gives this fit the kept instrumented train function (or
        traces it once and keeps it), guarded; a fit without this callback gets the original."""
        original_make = model.make_train_function

        def make_train_function(force=False):
            if not self._armed:
                # A new fit/train_on_batch without this callback while the hooks are still in
                # place (the previous fit did not end normally): the original step comes back.
                self._finish(model)
                return model.make_train_function(force=force)
            self._armed = False
            if self._pss:  # tf_keras under ParameterServerStrategy: its own train function
                model.train_function = pss_fit.train_function(self, model, self._traced_key(model))
                return model.train_function
            kept = self._traced
            if not force and kept is not None and kept[0] == self._traced_key(model):
                model.train_function = self._guarded(model, kept[1])
                return model.train_function
            # The step in two variants (`write.variants`): two functions Keras builds alike,
            # the plain one traced while `probe.plain_variant()` holds (its first call).
            variants = []
            for _ in ("full", "plain"):
                result = original_make(force=True if variants else force)
                variants.append(result if result is not None else model.train_function)
            self._traced = (self._traced_key(model), tuple(variants))
            model.train_function = self._guarded(model, self._traced[1])
            return model.train_function

        object.__setattr__(model, "make_train_function", make_train_function)

    def _guarded(self, model, variants):
        """The train function of both variants `(full, plain)` (`write.variants`), the one a
        call needs chosen on the host, restoring the model and flushing when an exception
        escapes a step."""
        full, plain = variants

        def train_function(*args, **kwargs):
            probe = self._probe
            probe.mark_call()
            try:
                if probe.full_needed(probe.next_host_step(), self._steps_per_call):
                    result = full(*args, **kwargs)
                else:
                    with probe.plain_variant():
                        result = plain(*args, **kwargs)
            except (StopIteration, tf.errors.OutOfRangeError):
                raise  # the end of a dataset of unknown length: fit goes on with the next epoch
            except BaseException as error:  # KeyboardInterrupt too; it goes on unchanged
                self._finish(model, error)
                raise
            probe.mark_call(returned=self._steps_per_call)
            return result

        return train_function

    def _instrumented_step(self, original, steps):
        """The train step: the step's batch named, each family's `before(batch)`, the model's own
        step, each family's `after()` (`steps`: every recorder's `fit_step`)."""
        probe = self._probe
        befores = [before for before, _ in steps if before is not None]
        afters = [after for _, after in steps if after is not None]
        batches = self._batches

        def train_step(data):
            if probe.plain_step:  # `write.variants`: the gradients' device record alone
                with probe.step():
                    with contextlib.suppress(Exception):
                        batches.put(nest.name_fit_batch(data))
                    return original(data)
            # One step: every family's values of each replica leave its device once, at the
            # end, as one vector (`ReplicaProbe.step`), and each replica's ready time is taken.
            with probe.step():
                try:
                    batch = nest.name_fit_batch(data)
                except Exception as error:  # noqa: BLE001 - never break the training it watches
                    probe.warn_failed("inputs", error)
                else:
                    batches.put(batch)
                    for before in befores:
                        before(batch)
                logs = original(data)
                for after in afters:
                    after()
            return logs

        return train_step

    def _restore(self, model):
        """Puts the model back as it was before `set_model` (the traced function is kept)."""
        self._armed = False
        while self._undo_hooks:
            self._undo_hooks.pop()()
        if self._patched is None:
            return
        had_own, own_step, jit_compile = self._patched
        self._patched = None
        if self._pss:
            self._supports_tf_logs = False
        if model.__dict__.get(INSTALLED_ATTR) is self:
            model.__dict__.pop(INSTALLED_ATTR, None)
        model.__dict__.pop("make_train_function", None)
        if had_own:
            model.train_step = own_step
        else:
            model.__dict__.pop("train_step", None)
        if model.jit_compile != jit_compile:
            model.jit_compile = jit_compile
        # The next fit without this callback must build a train function without the probe.
        model.train_function = None
