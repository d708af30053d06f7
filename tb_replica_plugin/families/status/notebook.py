"""The status family in IPython and Jupyter: a custom loop's stretch of training ends with the
notebook cell that ran it.

In a notebook a cell's exception is shown by the shell and never reaches `sys.excepthook`, and
the kernel lives on after a cell: without this, a custom loop that raised in a cell, or simply
returned without `probe.close()`, would keep heartbeating from an idle kernel and read as
stalled. `watch_cells` registers IPython's `pre_run_cell` / `post_run_cell` events (once per
process, when a stretch first begins in an IPython shell); after each cell, `cell_ran` ends the
open stretches the cell concerns:

- its exception passes through TensorFlow, Keras, tf_keras or this package (a failing step, a
  trace error, an interrupt inside a step): "crashed" ("interrupted" for KeyboardInterrupt);
- a KeyboardInterrupt elsewhere, for a stretch that began or recorded a step during the cell:
  "interrupted";
- a stretch that began or recorded a step during the cell and no exception of training's: the
  cell's training returned, "finished" (an error after it, in the user's own code, is not
  training's).

Each ends with `how` "cell" (`record.CELL`), through the `end_stretch` that `record.py` hands
to `watch_cells` with the list of stretches (`recorders`): this module imports nothing of the
recorder's, so the two do not import each other. The probe's next recorded step begins a new stretch
(`Recorder._resume_after_cell`). Keras `fit` ends its own stretches. A stretch that began in a
thread other than the main one (a loop or `fit` run in the background while cells run) is not
the cells': its thread's exception ends it (`Recorder.thread_died`), and the first cell run after
its thread returned ends it "finished".
"""

import contextlib
import sys
import threading

# Top-level modules whose frames in an exception's traceback tie it to training.
TRAINING_MODULES = frozenset({"tensorflow", "keras", "tf_keras", "tb_replica_plugin"})
# How many `__cause__` / `__context__` links `raised_in_training` follows.
CHAIN_DEPTH = 5

# `{id(recorder): step recorded}` of the stretches open or ended by a cell when the running cell
# started.
_steps_at_cell_start = {}
# What `watch_cells` was handed: `recorders()` lists the status recorders of the open stretches
# and of those a cell ended; `end_stretch(recorder, *error)` ends one with `how` "cell", quietly.
_hooks = {"recorders": list, "end_stretch": lambda recorder, *error: None}


def watch_cells(recorders, end_stretch):
    """Registers `cell_starts` and `cell_ran` with the running IPython shell, if any.

    Args:
      recorders: callable, no arguments, returning the status recorders a cell may concern (the
        open stretches' and those a cell ended), each with `probe`, `training_thread`, `is_open`.
      end_stretch: callable `(recorder, *error)` that ends the recorder's stretch with `how`
        "cell" (the exception that ended it, if any) and never raises.
    """
    _hooks.update(recorders=recorders, end_stretch=end_stretch)
    ipython = sys.modules.get("IPython")
    shell = ipython.get_ipython() if ipython is not None else None
    if shell is None:
        return
    with contextlib.suppress(Exception):
        shell.events.register("pre_run_cell", cell_starts)
        shell.events.register("post_run_cell", cell_ran)


def cell_starts(info=None):
    """IPython's `pre_run_cell`: notes the step each stretch is at."""
    _steps_at_cell_start.clear()
    for recorder in _hooks["recorders"]():
        with contextlib.suppress(Exception):
            _steps_at_cell_start[id(recorder)] = recorder.probe.recorded_step()


def cell_ran(result):
    """IPython's `post_run_cell`: ends the stretches the cell concerns (see the module
    docstring). Never raises (IPython would show it under the user's cell)."""
    error = getattr(result, "error_in_exec", None)
    in_training = error is not None and raised_in_training(error)
    interrupted = isinstance(error, KeyboardInterrupt)
    end_stretch = _hooks["end_stretch"]
    for recorder in _hooks["recorders"]():
        thread = recorder.training_thread
        if thread is not None and thread is not threading.main_thread():
            # Trained in a thread of its own: not the cell's. That thread's exception ends its
            # stretch (`thread_died`); once the thread has returned, the next cell ends it.
            if not thread.is_alive() and recorder.is_open:
                end_stretch(recorder)
            continue
        try:
            moved = moved_during_cell(recorder)
        except Exception:  # noqa: BLE001 - a probe that cannot say (disabled, closed)
            continue
        if in_training or (interrupted and moved):
            end = (error,)
        elif moved:
            end = ()
        else:
            continue
        # A stretch a cell ended begins again first when it recorded steps since (`ended`).
        end_stretch(recorder, *end)


def moved_during_cell(recorder):
    """Whether a stretch began or recorded a step since the cell started."""
    if id(recorder) not in _steps_at_cell_start:
        return True
    return recorder.probe.recorded_step() != _steps_at_cell_start[id(recorder)]


def raised_in_training(error, depth=CHAIN_DEPTH):
    """Whether the traceback of `error` (or of the exceptions it was raised from, `depth`
    links) has a frame of TensorFlow, Keras, tf_keras or this package.

    Example:
      >>> raised_in_training(NameError("plot"))  # raised by the user's own code
      False
    """
    while error is not None and depth > 0:
        tb = error.__traceback__
        while tb is not None:
            module = tb.tb_frame.f_globals.get("__name__") or ""
            if module.partition(".")[0] in TRAINING_MODULES:
                return True
            tb = tb.tb_next
        error, depth = error.__cause__ or error.__context__, depth - 1
    return False
