"""A log dir of hostile names and bad data, and the plugin's WSGI app over a real data provider.

`build_bad_logs` writes, with the real probe (2 replicas) and with hand-made events:

| run | what is wrong |
|---|---|
| `HOSTILE_RUN` | run, input, variable and generator names that are HTML/JS (every family) |
| `SCRIPT_RUN` | a run name that is HTML/JS |
| `corrupt/replicas` | bytes overwritten in the middle of the event file (CRC mismatch) |
| `truncated/replicas` | the event file cut in the middle of its last record |
| `newer_schema/replicas` | the shapes series written with schema version 99 |
| `bad_payload/replicas` | shapes events that are not JSON, dense samples of the wrong layout |
| `replica_change/replicas` | 2 replicas for steps 0-2, then 3 replicas |
| `good/replicas` | nothing: what the others are compared with |
"""

import json
import os
import shutil

HOSTILE_RUN = '<img src=x onerror="window.__xss=1">'
# A run name is the path under the log dir, so "</" is made of two directories.
SCRIPT_RUN = "<script>window.__xss=2</script>"  # a copy of good/replicas
HOSTILE_INPUT = '<img src=x onerror="window.__xss=3">'
BOLD_INPUT = "<b>ids</b>"
HOSTILE_VARIABLE = '<img src=x onerror="window.__xss=4">'  # mirrored: drift, gradients
BOLD_VARIABLE = "<b>lone</b>"  # created outside the strategy scope: not mirrored
HOSTILE_GENERATOR = '<img src=x onerror="window.__xss=5">'
CORRUPT_STEPS = 40
NOTE_NEWER = "Series 'inputs/shapes' skipped: Series written with schema version 99"
NOTE_REPLICAS = "The replica count changes within this run ([2, 3])"
NOTE_PAYLOAD = "2 unreadable shapes event(s) skipped."
NOTE_LAYOUT = "1 batch-size sample(s) of an unexpected layout skipped."


def _probe_run(strategy, run_dir, batches, update_freq=1):
    import tensorflow as tf

    from tb_replica_plugin import ReplicaProbe

    probe = ReplicaProbe(run_dir, strategy, update_freq=update_freq)

    @tf.function
    def step(batch):
        def step_fn(inputs):
            probe.observe_inputs(inputs)
            return tf.constant(0.0)

        return strategy.run(step_fn, args=(batch,))

    for batch in batches:
        step(batch)
    probe.close()


def _hostile_run(strategy, run_dir, batches):
    """Every family, under hostile names: inputs, rng, gradients and variables (2 steps)."""
    import tensorflow as tf

    from tb_replica_plugin import ReplicaProbe

    with strategy.scope():
        weight = tf.Variable(tf.ones([3]), name=HOSTILE_VARIABLE)
        noise = tf.random.Generator.from_seed(1)
    lone = tf.Variable(tf.ones([2]), name=BOLD_VARIABLE)
    probe = ReplicaProbe(run_dir, strategy, update_freq=1)

    @tf.function
    def step(batch):
        def step_fn(inputs):
            probe.observe_inputs(inputs)
            probe.observe_rng({HOSTILE_GENERATOR: noise}, include_global=False)
            with tf.GradientTape() as tape:
                loss = tf.reduce_sum(inputs[HOSTILE_INPUT][:, :3] * weight)
            grads = tape.gradient(loss, [weight])
            probe.observe_gradients(grads, [weight], loss=loss)
            return loss

        strategy.run(step_fn, args=(batch,))
        probe.observe_variables([weight, lone])

    for batch in batches:
        step(batch)
    probe.close()


def _shapes_document(sizes, width=3):
    devices = [f"/job:localhost/replica:0/task:0/device:CPU:{r}" for r in range(len(sizes))]
    return json.dumps(
        {
            "devices": devices,
            "replicas": list(range(len(sizes))),
            "source": "custom_loop",
            "inputs": [
                {
                    "name": "x",
                    "dtypes": ["float32"] * len(sizes),
                    "shapes": [[size, width] for size in sizes],
                }
            ],
        }
    )


def _write_events(run_dir, events):
    """Writes `(tag, value, step, metadata)` events with a plain TF summary writer."""
    import tensorflow as tf

    writer = tf.summary.create_file_writer(run_dir)
    with writer.as_default():
        for tag, value, step, summary_metadata in events:
            tf.summary.write(tag, value, step=step, metadata=summary_metadata)
    writer.close()


def _metadata(kind, version):
    from tensorboard.compat.proto import summary_pb2

    from tb_replica_plugin import metadata

    content = json.dumps({"version": version, "kind": kind}).encode()
    return summary_pb2.SummaryMetadata(
        plugin_data=summary_pb2.SummaryMetadata.PluginData(
            plugin_name=metadata.PLUGIN_NAME, content=content
        ),
        data_class=summary_pb2.DATA_CLASS_TENSOR,
    )


def _event_file(run_dir):
    (name,) = [f for f in os.listdir(run_dir) if f.startswith("events.out.tfevents")]
    return os.path.join(run_dir, name)


def build_bad_logs(logdir, strategy):
    """Writes the runs of the module docstring under `logdir` (2-replica `strategy`)."""
    import numpy as np
    import tensorflow as tf

    from tb_replica_plugin import metadata
    from tb_replica_plugin.families.inputs import schema as inputs_schema

    def hostile_inputs(context):
        width = 4 + context.replica_id_in_sync_group  # replica 1 differs: a shape mismatch
        return {HOSTILE_INPUT: tf.ones([3, width]), BOLD_INPUT: tf.zeros([3], tf.int32)}

    _hostile_run(
        strategy,
        os.path.join(logdir, HOSTILE_RUN),
        [strategy.experimental_distribute_values_from_function(hostile_inputs)] * 2,
    )
    # 40 steps of [2, 2], then [1, 0]: a shape event at 0 and at 40, a dense point per step.
    good = os.path.join(logdir, "good", "replicas")
    data = tf.data.Dataset.from_tensor_slices(np.zeros((4 * CORRUPT_STEPS + 1, 3), "float32"))
    _probe_run(strategy, good, strategy.experimental_distribute_dataset(data.batch(4)))
    # Copies of it (one trace of the probe's step is enough; tracing is the slow part).
    for copy in ("corrupt/replicas", "truncated/replicas", SCRIPT_RUN):
        shutil.copytree(good, os.path.join(logdir, *copy.split("/")))
    path = _event_file(os.path.join(logdir, "corrupt", "replicas"))
    with open(path, "r+b") as handle:
        size = os.path.getsize(path)
        handle.seek(size // 2)
        handle.write(b"\xff" * 16)
    path = _event_file(os.path.join(logdir, "truncated", "replicas"))
    os.truncate(path, os.path.getsize(path) - 7)

    dense = _metadata(inputs_schema.KIND_BATCH_SIZE, metadata.SCHEMA_VERSION)
    shapes = _metadata(inputs_schema.KIND_SHAPES, metadata.SCHEMA_VERSION)
    _write_events(
        os.path.join(logdir, "newer_schema", "replicas"),
        [(inputs_schema.TAG_SHAPES, _shapes_document([4, 4]), 0, _metadata("shapes", 99))]
        + [(inputs_schema.TAG_BATCH_SIZE, tf.fill([3, 2], 4), s, dense) for s in range(3)],
    )
    _write_events(
        os.path.join(logdir, "bad_payload", "replicas"),
        [
            (inputs_schema.TAG_SHAPES, _shapes_document([4, 4]), 0, shapes),
            (inputs_schema.TAG_SHAPES, "{not json", 1, shapes),
            (inputs_schema.TAG_SHAPES, '{"inputs": [{"name": "x"}]}', 2, shapes),
            (inputs_schema.TAG_BATCH_SIZE, tf.fill([3, 2], 4), 0, dense),
            (inputs_schema.TAG_BATCH_SIZE, tf.fill([2, 2], 4), 1, dense),
            (inputs_schema.TAG_BATCH_SIZE, tf.fill([3, 2], 4), 2, dense),
        ],
    )
    _write_events(
        os.path.join(logdir, "replica_change", "replicas"),
        [(inputs_schema.TAG_SHAPES, _shapes_document([4, 4]), 0, shapes)]
        + [(inputs_schema.TAG_SHAPES, _shapes_document([3, 3, 2]), 3, shapes)]
        + [(inputs_schema.TAG_BATCH_SIZE, tf.constant([[3, 3, 2]] * 3), 4, dense)],
    )


RUNS = [
    HOSTILE_RUN,
    SCRIPT_RUN,
    "bad_payload/replicas",
    "corrupt/replicas",
    "good/replicas",
    "newer_schema/replicas",
    "replica_change/replicas",
    "truncated/replicas",
]


def wsgi_app(logdir):
    """TensorBoard's own WSGI app with only this plugin, over a real multiplexer data provider.

    Returns:
      `(app, multiplexer)`: call `multiplexer.Reload()` to pick up new data, as TensorBoard's
      reload thread does.
    """
    from tensorboard.backend import application
    from tensorboard.backend.event_processing import data_provider, plugin_event_multiplexer
    from tensorboard.plugins import base_plugin

    from tb_replica_plugin import metadata
    from tb_replica_plugin.plugin import ReplicasPlugin

    multiplexer = plugin_event_multiplexer.EventMultiplexer(
        tensor_size_guidance={metadata.PLUGIN_NAME: 0}, max_reload_threads=1
    )
    multiplexer.AddRunsFromDirectory(logdir)
    multiplexer.Reload()
    provider = data_provider.MultiplexerDataProvider(multiplexer, logdir)
    context = base_plugin.TBContext(logdir=logdir, data_provider=provider, multiplexer=multiplexer)
    plugin = ReplicasPlugin(context)
    plugin.store.listing_reuse_s = 0  # each request sees the caller's explicit reloads
    app = application.TensorBoardWSGI([plugin], data_provider=provider)
    return app, multiplexer
