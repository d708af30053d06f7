"""How a stretch of training ended: `RunEnd` and `run_end`, the record every family's recorder
hears (`Recorder.ended`) and the status family writes down. Pure Python: the probe's engine
(`write.lifecycle`) builds them, and a recorder that finds a stretch left open (the status
family: a `fit` that never returned) builds one too.
"""

import dataclasses

FINISHED = "finished"
CRASHED = "crashed"
HALTED = "halted"
INTERRUPTED = "interrupted"
STATES = (FINISHED, CRASHED, HALTED, INTERRUPTED)


@dataclasses.dataclass(frozen=True)
class RunEnd:
    """The end of a stretch of training.

    Attributes:
      state: one of `STATES`: "finished" (a clean end), "crashed" (an exception), "halted"
        (`halt_on` stopped it), "interrupted" (KeyboardInterrupt).
      how: what ended it: "fit" (Keras `fit` returned or raised), "close" (`probe.close()`),
        "context" (a `with ReplicaProbe(...)` block exited), "exit" (the interpreter exited with
        the probe open), "exception" (an uncaught exception reached `sys.excepthook`), "cell"
        (the notebook cell that ran a custom loop returned or raised: `status/notebook.py`),
        "evaluate"/"predict" (begun with the callback after a `fit` that stopped without
        returning).
      error: the exception, or None.
      step: the training step it ended at when the host knows it (Keras `fit`), else None.
      findings: the `analysis.Finding`s that stopped training ("halted").
      context: `traceback.FrameSummary`s of the code that called the place where `error` was
        caught (outermost first), to put above the exception's own traceback; empty when the
        traceback reaches the outermost frame (`sys.excepthook`).
      unreturned: the stretch was a Keras `fit` that stopped without returning and without an
        exception escaping its step (its `on_train_end` never ran: another callback raised, or
        Ctrl-C landed between steps, and the script caught it), found by the next `fit` that
        gets the model; the status family records what it knows instead of "finished".
    """

    state: str
    how: str
    error: BaseException | None = None
    step: int | None = None
    findings: tuple = ()
    context: tuple = ()
    unreturned: bool = False


def run_end(how, error=None, step=None, findings=(), context=(), unreturned=False):
    """The `RunEnd` of a stretch of training that ended by `how`, with `error` or `findings`.

    Args:
      how: see `RunEnd.how`.
      error: the exception that ended it, or None.
      step: see `RunEnd.step`.
      findings: the findings that stopped it (`halt_on`), if any.
      context: see `RunEnd.context`.
      unreturned: see `RunEnd.unreturned`.

    Returns:
      A `RunEnd`: "halted" with findings (or a `ReplicaFaultError`, whose findings it takes),
      "interrupted" for KeyboardInterrupt, "finished" without error or for `SystemExit(0)`,
      else "crashed".

    Example:
      >>> run_end("fit", KeyboardInterrupt()).state
      'interrupted'
    """
    found = tuple(findings or getattr(error, "findings", None) or ())
    if isinstance(error, KeyboardInterrupt):
        state = INTERRUPTED
    elif isinstance(error, SystemExit) and error.code in (None, 0):
        state, error = FINISHED, None
    elif error is not None and not found:
        state = CRASHED
    else:
        state = HALTED if found else FINISHED
    return RunEnd(state, how, error, step, found, tuple(context), bool(unreturned))
