"""A child process of tests/test_status.py: a custom loop run cell by cell in a real IPython shell.

`python tests/notebook_child.py LOGDIR` runs these cells with IPython's `InteractiveShell` (what a
Jupyter kernel runs cells with), on 2 logical CPU replicas, a probe writing `LOGDIR/loop` with a
heartbeat every 0.2 s:

0. the set-up: the strategy, the probe, a loop whose step asserts its batch is finite on
   replica 1 (`status_loops.loop`);
1. 2 steps (0, 1);
2. a `NameError` in code that is not training's;
3. a step whose batch holds a NaN on replica 1 (step 2): `InvalidArgumentError`;
4. 2 steps more (3, 4): the loop run again after the crash;
5. steps until a `SIGINT` 1 s after the cell began (Jupyter's "interrupt the kernel"); just
   before it, a thread notes the run's state while the loop runs;
6. 1 step more;
7. `probe.close()`;
8. a second probe's loop (`LOGDIR/background`) started in a thread named `trainer`: the cell
   returns while it trains, until cell 10;
9. the kernel busy 1 s with something else while it trains;
10. the thread told to stop and joined.

After each cell (and a few heartbeats' time) it notes each run's state as `tb_replica_plugin.load`
reads it; prints one JSON line `{"states": [...], "background": [...], "while_training": state,
"errors": [...]}` (each cell's exception class, or null).
"""

import json
import os
import signal
import sys

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")
REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path[:0] = [REPO, os.path.join(REPO, "tests")]

SETUP = """
import time
import tensorflow as tf
from demo import scenarios
from status_loops import loop, make_step
from tb_replica_plugin import ReplicaProbe

strategy = tf.distribute.MirroredStrategy(scenarios.configure_devices(2))
probe = ReplicaProbe(LOGDIR + "/loop", strategy, update_freq=1, flush_secs=0.2)
step = make_step(probe, strategy)

def interrupt_in(seconds):
    # A SIGINT `seconds` from now (Jupyter's "interrupt the kernel"); the run's state noted first.
    import os, signal, threading

    def send():
        WHILE_TRAINING.append(STATE_OF(LOGDIR))
        os.kill(os.getpid(), signal.SIGINT)

    threading.Timer(seconds, send).start()

def train(steps, nan=False):
    loop(probe, strategy, steps, fail_at=0 if nan else None, step=step)  # a NaN on replica 1

def start_background():
    # A loop in a thread of its own, stepping until told to stop (at most 20,000 steps).
    import threading

    stop = threading.Event()
    other = ReplicaProbe(LOGDIR + "/background", strategy, update_freq=1, flush_secs=0.2)
    other_step = make_step(other, strategy)

    def run():
        for _ in range(20000):
            if stop.is_set():
                return
            loop(other, strategy, 1, step=other_step)

    thread = threading.Thread(target=run, name="trainer")
    thread.start()
    return stop, thread
"""

INTERRUPTED_LOOP = """
interrupt_in(1.0)
for _ in range(20000):  # ends the cell without an interrupt if SIGINT never arrives
    train(1)
"""

CELLS = [
    SETUP,
    "train(2)",
    "print(not_defined_anywhere)",
    "train(1, nan=True)",
    "train(2)",
    INTERRUPTED_LOOP,
    "train(1)",
    "probe.close()",
    "stop, trainer = start_background()",
    "time.sleep(1.0)",
    "stop.set(); trainer.join()",
]


def state_of(logdir, run="loop"):
    """The run's state now, its latest segment's end `[state, how, step]` (None while it runs),
    how many "start" events it has, and its findings' kinds."""
    import time

    from tb_replica_plugin import load
    from tb_replica_plugin.families.status import rules

    report = load(logdir)
    if run not in report.runs:
        return {"state": None, "end": None, "starts": 0, "findings": []}
    status = report.runs[run].status
    end = status.end
    return {
        "state": rules.run_state(status, time.time()).state,
        "end": [end["state"], end["how"], end["step"]] if end else None,
        "starts": sum(event["type"] == "start" for event in status.events),
        "findings": sorted(f.kind for f in report.findings[run]),
    }


def main():
    logdir = sys.argv[1]
    # Ctrl-C raises KeyboardInterrupt, as in a Jupyter kernel: a process started from a
    # non-interactive shell's background job (`cmd &`, as CI may run the tests) inherits SIGINT
    # ignored, and Python then leaves it so.
    signal.signal(signal.SIGINT, signal.default_int_handler)
    from IPython.core.interactiveshell import InteractiveShell

    shell = InteractiveShell.instance()
    while_training = []
    shell.user_ns.update(
        LOGDIR=logdir,
        STATE_OF=state_of,
        WHILE_TRAINING=while_training,
    )
    states, background, errors = [], [], []
    for cell in CELLS:
        result = shell.run_cell(cell, store_history=True)
        error = result.error_in_exec or result.error_before_exec
        errors.append(type(error).__name__ if error is not None else None)
        shell.run_cell("time.sleep(0.6)")  # a few heartbeats, the kernel idle
        states.append(state_of(logdir))
        background.append(state_of(logdir, "background"))
    document = {
        "states": states,
        "background": background,
        "while_training": while_training[0],
        "errors": errors,
    }
    print(json.dumps(document), flush=True)


if __name__ == "__main__":
    main()
