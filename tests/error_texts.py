"""The real TensorFlow error texts of tests/status_texts/ (see its README), for the status
family's tests (no pytest: imported by them)."""

import json
import os

TEXTS = os.path.join(os.path.dirname(os.path.abspath(__file__)), "status_texts")
HOME = "/home/me/project"  # the user's project in the texts' frames


def read_text(name):
    with open(os.path.join(TEXTS, name), encoding="utf-8") as f:
        return f.read()


def keras_crash():
    """The Keras 3 fit crash on replica 1 (class, module, message, traceback)."""
    return json.loads(read_text("keras3_fit_replica1_checknumerics.json"))


def sigkill_message():
    """Worker 0's UnavailableError text after worker 1 was SIGKILLed."""
    log = read_text("mwms_worker0_after_worker1_sigkill.log")
    start = log.index("UnavailableError: ") + len("UnavailableError: ")
    return log[start : log.index("[w0] end")].rstrip("\n")
