"""The status family's attribution of TensorFlow's error texts (pure, on the real texts of
tests/status_texts/): the replicas, devices, tasks, node and user frame a crash names, frames
from stacks and tracebacks, and that the status modules import no TensorFlow.
"""

import json
import subprocess
import sys
import threading

import numpy as np
import pytest
from error_texts import HOME, keras_crash, read_text, sigkill_message
from hypothesis import given, settings
from hypothesis import strategies as st

from tb_replica_plugin.families.status import attribution, schema


def test_keras_fit_crash_text_names_replica_1_its_node_and_the_user_frame():
    parsed = attribution.parse_error_text(keras_crash()["message"])
    assert parsed["node"] == "replica_1/sequential_1/check_1/VerifyFinite/CheckNumerics"
    assert parsed["local_replicas"] == [1]
    assert (parsed["devices"], parsed["tasks"], parsed["unhealthy_tasks"]) == ([], [], [])
    assert parsed["first_line"] == "input not finite : Tensor had NaN values"
    frames = parsed["defined_at"]
    assert len(frames) == 18  # the first of the two identical blocks
    assert frames[0]["function"] == "_bootstrap" and not frames[0]["user"]
    assert [f["user"] for f in frames].count(True) == 1  # keras/ and threading.py are not
    assert attribution.user_frame(frames) == {
        "file": "/tmp/exp/crash2.py",
        "line": 9,
        "function": "call",
        "user": True,
    }


def test_a_failure_names_the_replica_of_its_failing_node_not_those_the_error_passed():
    """On 4 replicas TensorFlow's root errors name replica 1's failing node and, on the nodes
    the error passed through on its way out of the step, replicas 2 and 3: replica 1 only."""
    document = json.loads(read_text("keras3_fit_4_replicas_failing_on_replica1.json"))
    message = document["message"]
    assert "StatefulPartitionedCall/replica_3/" in message  # what must not count
    parsed = attribution.parse_error_text(message)
    assert parsed["node"].startswith("replica_1/") and parsed["local_replicas"] == [1]
    # Replica 0's failing node has no prefix: no replica named, though replica_3 is passed.
    text = "  (0) INVALID_ARGUMENT: bad\n\t [[{{node dense/CheckNumerics}}]]\n\t [[X/replica_3/y]]"
    assert attribution.parse_error_text(text)["local_replicas"] == []
    # Without any failing node in the text, every replica_N/ prefix counts.
    assert attribution.parse_error_text("in replica_2/dense/MatMul")["local_replicas"] == [2]


def test_sigkill_text_names_the_unhealthy_worker_and_the_collective():
    parsed = attribution.parse_error_text(sigkill_message())
    assert parsed["node"] == "CollectiveReduceV2"
    assert parsed["local_replicas"] == []
    assert parsed["unhealthy_tasks"] == [{"task_type": "worker", "task_index": 1}]
    assert parsed["tasks"] == [{"task_type": "worker", "task_index": 1}]
    assert [(f["line"], f["function"], f["user"]) for f in parsed["defined_at"]] == [
        (47, "<module>", True),
        (37, "step", True),
    ]
    assert parsed["first_line"].startswith("Collective ops is aborted by: Error reported from")


def test_gpu_text_names_replica_3_and_its_device():
    parsed = attribution.parse_error_text(read_text("gpu_oom_replica3.txt"))
    assert parsed["node"] == "replica_3/model/dense_2/MatMul"
    assert parsed["local_replicas"] == [3]
    assert parsed["devices"] == ["/job:localhost/replica:0/task:0/device:GPU:3"]
    assert parsed["tasks"] == [{"task_type": "localhost", "task_index": 0}]
    assert parsed["first_line"].startswith("OOM when allocating tensor with shape[65536,65536]")
    user = [(f["file"], f["line"]) for f in parsed["defined_at"] if f["user"]]
    assert user == [(f"{HOME}/train.py", 41), (f"{HOME}/model.py", 22)]  # dist-packages/keras not
    assert attribution.user_frame(parsed["defined_at"])["function"] == "call"


def test_unhealthy_tasks_span_several_lines_and_stop_at_other_text():
    text = (
        "{{function_node __inference_step_52}} Collective ops is aborted by: "
        + "The following tasks are unhealthy (stopped sending heartbeats):\n"
        + "/job:worker/replica:0/task:3\n/job:worker/replica:0/task:1, /job:chief/task:0\n"
        + "The tasks have crashed. /job:worker/replica:0/task:7 is fine."
    )
    parsed = attribution.parse_error_text(text)
    assert parsed["unhealthy_tasks"] == [
        {"task_type": "chief", "task_index": 0},
        {"task_type": "worker", "task_index": 1},
        {"task_type": "worker", "task_index": 3},
    ]
    assert {"task_type": "worker", "task_index": 7} in parsed["tasks"]
    assert parsed["first_line"].startswith("Collective ops is aborted by:")  # prefix dropped


def test_device_names_are_normalised_and_quoted_nodes_read():
    text = (
        "Detected at node 'replica_2/add' defined at (most recent call last):\n"
        "on /device:gpu:1 and /job:worker/replica:0/task:1/device:CPU:0 and /device:gpu:1"
    )
    parsed = attribution.parse_error_text(text)
    assert parsed["node"] == "replica_2/add"
    assert parsed["devices"] == ["/device:GPU:1", "/job:worker/replica:0/task:1/device:CPU:0"]
    assert parsed["first_line"].startswith("on /device:gpu:1")


def test_is_user_file_by_the_interpreter_paths_and_by_layout():
    assert attribution.is_user_file(__file__)  # tests/ of a checkout are the user's
    assert attribution.is_user_file("/tmp/exp/crash2.py")
    assert attribution.is_user_file("<ipython-input-3-1f2e>")
    assert not attribution.is_user_file(threading.__file__)
    assert not attribution.is_user_file(np.__file__)
    assert not attribution.is_user_file(attribution.__file__)  # this package, editable or not
    assert not attribution.is_user_file("<frozen runpy>")
    assert not attribution.is_user_file("<string>")
    assert not attribution.is_user_file("")
    assert not attribution.is_user_file("/opt/py/lib/python3.12/site-packages/tf_keras/x.py")
    assert not attribution.is_user_file("/usr/lib/python3/dist-packages/absl/app.py")
    assert not attribution.is_user_file("/usr/lib/python3.10/threading.py")
    assert attribution.is_user_file("/opt/py/lib/python3.12/site-packages/mylib/train.py")


def test_frames_from_stack_and_traceback_are_outermost_first():
    def inner():
        return attribution.frames_from_stack(sys._getframe())

    frames = inner()
    assert frames[-1]["function"] == "inner" and frames[-1]["user"]
    assert frames[-2]["function"] == "test_frames_from_stack_and_traceback_are_outermost_first"
    assert len(frames) <= schema.MAX_FRAMES

    def fail():
        raise ValueError("boom")

    with pytest.raises(ValueError) as caught:
        fail()
    traced = attribution.frames_from_traceback(caught.value.__traceback__)
    assert [f["function"] for f in traced] == [
        "test_frames_from_stack_and_traceback_are_outermost_first",
        "fail",
    ]
    assert attribution.frames_from_stack(None) == attribution.frames_from_traceback(None) == []


def test_cut_frames_keeps_the_innermost_and_the_user_frames():
    frames = [
        attribution.make_frame("/app/main.py" if i in (3, 40) else threading.__file__, i, "f")
        for i in range(200)
    ]
    kept = attribution.cut_frames(frames)
    lines = [f["line"] for f in kept]
    assert len(kept) == schema.MAX_FRAMES
    assert lines == sorted(lines)  # outermost first still
    assert {3, 40} <= set(lines)  # the user frames
    assert lines[-attribution.INNERMOST_KEPT :] == list(range(184, 200))
    assert attribution.user_frame(kept)["line"] == 40


class InvalidArgumentError(Exception):
    """Stands for TensorFlow's (its class name is what the record keeps)."""


def test_exception_record_of_the_keras_crash_on_worker_1():
    crash = keras_crash()
    try:
        raise InvalidArgumentError(crash["message"])
    except InvalidArgumentError as error:
        record = attribution.exception_record(error, step=3, replicas_of=lambda local: 2 + local)
    assert record["class"] == "InvalidArgumentError"
    assert record["module"] == __name__
    assert record["replicas"] == [3]  # local replica 1 of a worker holding replicas 2 and 3
    assert record["node"] == "replica_1/sequential_1/check_1/VerifyFinite/CheckNumerics"
    assert record["step"] == 3
    assert attribution.user_frame(record["defined_at"])["line"] == 9
    assert (
        record["frames"][-1]["function"] == "test_exception_record_of_the_keras_crash_on_worker_1"
    )
    message = record["message"]
    assert len(crash["message"]) > schema.MESSAGE_CHARS >= len(message)
    assert message.startswith("Graph execution error:")
    assert "characters cut" in message
    assert message.endswith("[Op:__inference_multi_step_on_iterator_715]")  # root errors kept
    assert attribution.first_line(message) == "input not finite : Tensor had NaN values"
    assert json.loads(json.dumps(record)) == record


def test_exception_record_maps_devices_and_follows_the_cause():
    oom = read_text("gpu_oom_replica3.txt").replace("replica_3/", "")  # replica 0's ops: no prefix
    devices = [f"/job:localhost/replica:0/task:0/device:GPU:{i}" for i in range(4)]
    try:
        try:
            raise InvalidArgumentError(oom)
        except InvalidArgumentError as inner:
            raise RuntimeError("training failed") from inner
    except RuntimeError as error:
        record = attribution.exception_record(error, devices=devices)
    assert (record["class"], record["message"]) == ("RuntimeError", "training failed")
    assert record["replicas"] == [3]  # from the device the inner text names
    assert record["node"] == "model/dense_2/MatMul"
    assert record["devices"] == [devices[3]]
    assert [f["line"] for f in record["defined_at"] if f["user"]] == [41, 22]


@settings(max_examples=300, deadline=None)
@given(st.text())
def test_parse_error_text_never_raises(text):
    parsed = attribution.parse_error_text(text)
    assert set(parsed) == {
        "node",
        "local_replicas",
        "devices",
        "tasks",
        "unhealthy_tasks",
        "defined_at",
        "first_line",
    }
    assert len(attribution.cut_message(text)) <= schema.MESSAGE_CHARS


@settings(max_examples=100, deadline=None)
@given(st.lists(st.sampled_from(["\n", '  File "/a.py", line 1, in f', "replica_2/", "x"])))
def test_parse_error_text_never_raises_on_tensorflow_like_pieces(pieces):
    text = "Detected at node n defined at (most recent call last):\n" + "".join(pieces)
    parsed = attribution.parse_error_text(
        text + "The following tasks are unhealthy (stopped sending heartbeats):\n" + "".join(pieces)
    )
    assert parsed["node"] == "n"


def test_status_modules_import_no_tensorflow():
    code = (
        "import sys\n"
        "from tb_replica_plugin.families.status import attribution, present, read, rules\n"
        "assert 'tensorflow' not in sys.modules, sorted(m for m in sys.modules if 'tensorf' in m)"
    )
    subprocess.run([sys.executable, "-c", code], check=True, timeout=60)
