"""Demo scenarios: a balanced run and the seed failures of the inputs family, each its own run.

Every scenario trains (or inspects) on logical CPU replicas and writes `LOGDIR/<scenario>/...`:

- `balanced`: Keras `fit`, 256 examples, global batch 32 over 4 replicas → [8, 8, 8, 8].
- `empty_last_shard`: Keras `fit`, 66 examples, global batch 32 → the last batch is 2 examples,
  [1, 1, 0, 0]: two replicas train on nothing at that step.
- `batch_not_divisible`: global batch 30 over 4 replicas → [8, 8, 8, 6] (tf.distribute
  splits 30 as 8+8+8+6). Keras 3 `fit` cannot run
  this (its first batch splits unevenly), so it is a custom loop with `ReplicaProbe`, plus the
  pre-flight inspector run that explains why `fit` would fail.
- `shape_mismatch`: a custom loop whose per-replica preprocessing is inconsistent: replica 2
  resizes images to 24×24 instead of 32×32, so `strategy.gather` of its features would fail.
- `dropout_fit`: Keras `fit` of a model with a stock `Dropout` layer: every replica draws the same
  dropout mask (Keras 3 under MirroredStrategy), the `identical_rng_streams` finding.
- `generator_loop`: a custom loop whose noise comes from a `tf.random.Generator` created under
  `strategy.scope()`: one stream per replica, no finding.
- `unsharded_pipeline` / `sharded_pipeline`: `distribute_datasets_from_function` whose dataset
  function ignores its `input_context` (every replica gets the same examples: the
  `duplicate_examples` finding) next to the correctly sharded twin (no finding).
- `weight_drift`: two twin custom loops with a hand-written SGD step in cross-replica context:
  `skipped_allreduce` applies each replica's own gradient to its own copy (no all-reduce), so
  the copies drift apart from the first step; `synchronized` all-reduces the gradients first
  and stays bit-identical. Plus `batchnorm_fit`: Keras `fit` of a model with
  BatchNormalization, whose moving statistics Keras 3 updates per replica.
- `gradient_outlier`: Keras `fit` where replica 2's shard of every global batch is scaled ×100
  (run `replicas`: its local gradient norm is far above the others'), and its clean twin (run
  `clean`, the same data unscaled).
- `nan_replica`: Keras `fit` with `TerminateOnNaN` where one label of replica 1's batch at step 5
  is NaN (run `replicas`: the NaN loss and gradients are recorded at step 5 on replica 1 although
  only every 4th step is logged; `TerminateOnNaN` stops training there, before the NaN weights
  reach the other replicas' next step), and its clean twin (run `clean`).

- `gather_mismatch` and `ragged_text`: the watch family and ragged inputs
  (`demo/watch_scenarios.py`).
- `slow_replica`: replica 1 does about 20 ms more work per step (`demo/step_time_scenarios.py`).
- `pss_unbalanced`: a `ParameterServerStrategy` job (2 workers, 2 ps) with an unpartitioned
  embedding table and a worker fed batches of 2 (`demo/pss.py`, in a process of its own: run by
  `demo/train.py` after these).

Call `configure_devices(n)` before anything else touches TensorFlow devices.
"""

import os

import numpy as np

from demo import status_scenarios, step_time_scenarios, watch_scenarios

SCENARIOS = (
    "balanced",
    "empty_last_shard",
    "batch_not_divisible",
    "shape_mismatch",
    "dropout_fit",
    "generator_loop",
    "unsharded_pipeline",
    "sharded_pipeline",
    "weight_drift",
    "gradient_outlier",
    "nan_replica",
    "gather_mismatch",
    "ragged_text",
    "slow_replica",
    "crash",  # last: it ends a fit with an exception
)


def configure_devices(num_replicas=4):
    """Splits the CPU into `num_replicas` logical devices (once per process).

    Returns:
      The device names, e.g. `["/cpu:0", "/cpu:1", ...]`.
    """
    import tensorflow as tf

    cpu = tf.config.list_physical_devices("CPU")[0]
    if tf.config.get_logical_device_configuration(cpu) is None:
        tf.config.set_logical_device_configuration(
            cpu, [tf.config.LogicalDeviceConfiguration()] * num_replicas
        )
    count = len(tf.config.list_logical_devices("CPU"))
    if count < num_replicas:
        raise RuntimeError(f"{num_replicas} CPU replicas wanted, {count} logical CPUs configured")
    return [f"/cpu:{i}" for i in range(num_replicas)]


def _mlp(strategy, features):
    import keras

    with strategy.scope():
        model = keras.Sequential(
            [
                keras.Input((features,)),
                keras.layers.Dense(16, activation="relu"),
                keras.layers.Dense(1),
            ]
        )
        model.compile(optimizer="adam", loss="mse")
    return model


def _regression_data(count, features=8, seed=0):
    rng = np.random.default_rng(seed)
    x = rng.normal(size=(count, features)).astype("float32")
    y = (x.sum(axis=1, keepdims=True) * 0.1).astype("float32")
    return x, y


def fit_run(strategy, logdir, examples, global_batch, epochs=2, update_freq="epoch"):
    """Keras `fit` with `ReplicaCallback` on a `examples`-long dataset."""
    import tensorflow as tf

    from tb_replica_plugin import ReplicaCallback

    x, y = _regression_data(examples)
    dataset = tf.data.Dataset.from_tensor_slices((x, y)).batch(global_batch)
    model = _mlp(strategy, x.shape[1])
    model.fit(
        dataset,
        epochs=epochs,
        verbose=0,
        callbacks=[ReplicaCallback(logdir, update_freq=update_freq)],
    )
    return model


def custom_loop_run(strategy, logdir, examples, global_batch, epochs=1):
    """A custom training loop with `ReplicaProbe` inside `strategy.run`."""
    import keras
    import tensorflow as tf

    from tb_replica_plugin import ReplicaProbe

    x, y = _regression_data(examples)
    dataset = strategy.experimental_distribute_dataset(
        tf.data.Dataset.from_tensor_slices((x, y)).batch(global_batch)
    )
    with strategy.scope():
        model = keras.Sequential([keras.Input((x.shape[1],)), keras.layers.Dense(1)])
        optimizer = keras.optimizers.SGD(0.01)
        optimizer.build(model.trainable_variables)
    probe = ReplicaProbe(os.path.join(logdir, "replicas"), strategy, update_freq=1)

    @tf.function
    def train_step(batch):
        def step_fn(features, labels):
            probe.observe_inputs({"x": features, "y": labels})
            with tf.GradientTape() as tape:
                error = model(features) - labels
                loss = tf.reduce_sum(error * error) / global_batch
            grads = tape.gradient(loss, model.trainable_variables)
            optimizer.apply_gradients(zip(grads, model.trainable_variables, strict=True))
            return loss

        return strategy.run(step_fn, args=batch)

    for _ in range(epochs):
        for batch in dataset:
            train_step(batch)
    probe.close()


def shape_mismatch_run(strategy, logdir, steps=6, per_replica_batch=4, odd_replica=2):
    """Per-replica preprocessing that resizes images differently on one replica."""
    import tensorflow as tf

    from tb_replica_plugin import ReplicaProbe

    num = strategy.num_replicas_in_sync
    odd_replica = min(odd_replica, num - 1)

    def make_inputs(context):
        replica = context.replica_id_in_sync_group
        size = 24 if replica == odd_replica else 32
        images = tf.random.stateless_uniform([per_replica_batch, size, size, 3], seed=[replica, 0])
        labels = tf.zeros([per_replica_batch], tf.int64)
        return {"image": images, "label": labels}

    probe = ReplicaProbe(os.path.join(logdir, "replicas"), strategy, update_freq=1)

    @tf.function
    def train_step(batch):
        def step_fn(inputs):
            probe.observe_inputs(inputs)
            return tf.reduce_mean(inputs["image"])

        return strategy.run(step_fn, args=(batch,))

    for _ in range(steps):
        train_step(strategy.experimental_distribute_values_from_function(make_inputs))
    probe.close()


def dropout_fit_run(strategy, logdir, examples=128, global_batch=32, epochs=2):
    """Keras `fit` of an MLP with a stock Dropout layer, every step logged."""
    import keras
    import tensorflow as tf

    from tb_replica_plugin import ReplicaCallback

    x, y = _regression_data(examples)
    with strategy.scope():
        model = keras.Sequential(
            [
                keras.Input((x.shape[1],)),
                keras.layers.Dense(32, activation="relu"),
                keras.layers.Dropout(0.3, name="dropout"),
                keras.layers.Dense(1),
            ]
        )
        model.compile(optimizer="adam", loss="mse")
    dataset = tf.data.Dataset.from_tensor_slices((x, y)).batch(global_batch)
    model.fit(dataset, epochs=epochs, verbose=0, callbacks=[ReplicaCallback(logdir, update_freq=1)])


def generator_loop_run(strategy, logdir, steps=8, per_replica_batch=8, features=8):
    """A custom loop adding noise from a tf.random.Generator created under strategy.scope()."""
    import keras
    import tensorflow as tf

    from tb_replica_plugin import ReplicaProbe

    global_batch = per_replica_batch * strategy.num_replicas_in_sync
    x, y = _regression_data(steps * global_batch, features)
    dataset = strategy.experimental_distribute_dataset(
        tf.data.Dataset.from_tensor_slices((x, y)).batch(global_batch)
    )
    with strategy.scope():
        noise = tf.random.Generator.from_seed(2026)
        model = keras.Sequential([keras.Input((features,)), keras.layers.Dense(1)])
        optimizer = keras.optimizers.SGD(0.01)
        optimizer.build(model.trainable_variables)
    probe = ReplicaProbe(os.path.join(logdir, "replicas"), strategy, update_freq=1)

    @tf.function
    def train_step(batch):
        def step_fn(features_batch, labels):
            probe.observe_inputs({"x": features_batch, "y": labels})
            probe.observe_examples({"x": features_batch, "y": labels})
            probe.observe_rng({"noise": noise}, include_global=False)
            noisy = features_batch + 0.1 * noise.normal(tf.shape(features_batch))
            with tf.GradientTape() as tape:
                error = model(noisy) - labels
                loss = tf.reduce_sum(error * error) / global_batch
            grads = tape.gradient(loss, model.trainable_variables)
            optimizer.apply_gradients(zip(grads, model.trainable_variables, strict=True))
            return loss

        return strategy.run(step_fn, args=batch)

    for batch in dataset:
        train_step(batch)
    probe.close()


def pipeline_run(strategy, logdir, sharded, examples=256, global_batch=32, epochs=1):
    """`distribute_datasets_from_function`, with or without sharding by `input_context`.

    One input pipeline per replica (`InputReplicationMode.PER_REPLICA`): the dataset function runs
    once per replica, as it runs once per worker in a multi-worker job. A function that ignores
    its `input_context` then feeds every replica the same examples.
    """
    import tensorflow as tf

    from tb_replica_plugin import ReplicaProbe

    x, y = _regression_data(examples)

    def dataset_fn(input_context):
        dataset = tf.data.Dataset.from_tensor_slices((x, y))
        if sharded:
            dataset = dataset.shard(
                input_context.num_input_pipelines, input_context.input_pipeline_id
            )
        # Both pipelines batch per replica as they should; only the sharding differs.
        return dataset.batch(input_context.get_per_replica_batch_size(global_batch))

    options = tf.distribute.InputOptions(
        experimental_replication_mode=tf.distribute.InputReplicationMode.PER_REPLICA,
        experimental_fetch_to_device=False,
    )
    dataset = strategy.distribute_datasets_from_function(dataset_fn, options)
    probe = ReplicaProbe(os.path.join(logdir, "replicas"), strategy, update_freq=1)

    @tf.function
    def train_step(batch):
        def step_fn(features, labels):
            probe.observe_inputs({"x": features, "y": labels})
            probe.observe_examples({"x": features, "y": labels})
            return tf.reduce_mean(features)

        return strategy.run(step_fn, args=batch)

    for _ in range(epochs):
        for batch in dataset:
            train_step(batch)
    probe.close()


def drift_run(strategy, logdir, all_reduce, steps=12, global_batch=32, exact_every=4):
    """A custom loop whose SGD step skips (or not) the gradient all-reduce.

    Each replica computes the gradient of its own shard in `strategy.run`, all-reduced to the
    mean (`all_reduce=True`, what `optimizer.apply_gradients` does) or not (`all_reduce=False`:
    the bug); then, in cross-replica context, each copy of a variable is updated with its own
    replica's gradient. Variables are checked after every step
    with the default fingerprints, and exactly every `exact_every` steps.
    """
    import keras
    import tensorflow as tf

    from tb_replica_plugin import ReplicaProbe

    x, y = _regression_data(steps * global_batch, seed=1)
    dataset = strategy.experimental_distribute_dataset(
        tf.data.Dataset.from_tensor_slices((x, y)).batch(global_batch)
    )
    keras.utils.set_random_seed(0)
    with strategy.scope():
        model = keras.Sequential(
            [
                keras.Input((x.shape[1],)),
                keras.layers.Dense(32, activation="relu"),
                keras.layers.Dense(1),
            ]
        )
    learning_rate = 0.05
    probe = ReplicaProbe(logdir, strategy, update_freq=1)

    @tf.function
    def train_step(batch):
        def step_fn(features, labels):
            probe.observe_inputs({"x": features, "y": labels})
            with tf.GradientTape() as tape:
                error = model(features) - labels
                loss = tf.reduce_mean(error * error)
            grads = tape.gradient(loss, model.trainable_variables)
            if all_reduce:  # the only difference between the twins
                context = tf.distribute.get_replica_context()
                grads = context.all_reduce(tf.distribute.ReduceOp.MEAN, grads)
            return grads

        grads = strategy.run(step_fn, args=batch)
        # Each copy gets its own replica's gradient: the same everywhere after an all-reduce,
        # the replica's local gradient without one (the bug).
        for variable, grad in zip(model.trainable_variables, grads, strict=True):
            local = strategy.experimental_local_results(grad)
            for copy, local_grad in zip(variable.value.values, local, strict=True):
                copy.assign_sub(learning_rate * local_grad)

    for step, batch in enumerate(dataset):
        train_step(batch)
        probe.observe_variables(model.variables, step=step, exact=step % exact_every == 0)
    probe.close()


def batchnorm_fit_run(strategy, logdir, examples=256, global_batch=32, epochs=3):
    """Keras `fit` with BatchNormalization: its moving statistics drift across replicas."""
    import keras
    import tensorflow as tf

    from tb_replica_plugin import ReplicaCallback

    x, y = _regression_data(examples, seed=2)
    x = x + np.linspace(0, 4, examples, dtype="float32")[:, None]  # shards differ
    dataset = tf.data.Dataset.from_tensor_slices((x, y)).batch(global_batch)
    with strategy.scope():
        model = keras.Sequential(
            [
                keras.Input((x.shape[1],)),
                keras.layers.Dense(8),
                keras.layers.BatchNormalization(),
                keras.layers.Dense(1),
            ]
        )
        model.compile(optimizer="adam", loss="mse")
    model.fit(
        dataset,
        epochs=epochs,
        verbose=0,
        callbacks=[ReplicaCallback(logdir, run_name="batchnorm_fit")],
    )


def replica_rows(num_replicas, global_batch, replica, examples):
    """Indices of the examples `replica` gets from a dataset batched by `global_batch`
    (tf.distribute splits an even global batch into consecutive per-replica slices)."""
    per = global_batch // num_replicas
    return [i for i in range(examples) if (i % global_batch) // per == replica]


def gradient_fit_run(strategy, logdir, x, y, global_batch, run_name, epochs=1, callbacks=()):
    """Keras `fit` with `ReplicaCallback(update_freq=4)` on given arrays (no shuffling)."""
    import tensorflow as tf

    from tb_replica_plugin import ReplicaCallback

    dataset = tf.data.Dataset.from_tensor_slices((x, y)).batch(global_batch)
    model = _mlp(strategy, x.shape[1])
    model.fit(
        dataset,
        epochs=epochs,
        verbose=0,
        callbacks=[*callbacks, ReplicaCallback(logdir, run_name=run_name, update_freq=4)],
    )


def gradient_outlier_runs(strategy, logdir, examples=256, global_batch=32, odd_replica=2):
    """Replica `odd_replica`'s shard scaled ×100 (run `replicas`) and the clean twin (`clean`)."""
    num = strategy.num_replicas_in_sync
    x, y = _regression_data(examples, seed=1)
    scaled = x.copy()
    scaled[replica_rows(num, global_batch, min(odd_replica, num - 1), examples)] *= 100.0
    gradient_fit_run(strategy, logdir, scaled, y, global_batch, "replicas", epochs=2)
    gradient_fit_run(strategy, logdir, x, y, global_batch, "clean", epochs=2)


def nan_replica_runs(strategy, logdir, examples=256, global_batch=32, nan_step=5, replica=1):
    """A NaN in one example of `replica`'s batch at `nan_step` (run `replicas`), training with
    `TerminateOnNaN`, and the clean twin (run `clean`)."""
    import keras

    num = strategy.num_replicas_in_sync
    x, y = _regression_data(examples, seed=2)
    poisoned = y.copy()
    rows = replica_rows(num, global_batch, min(replica, num - 1), examples)
    poisoned[[r for r in rows if r // global_batch == nan_step][1], 0] = np.nan
    stop = [keras.callbacks.TerminateOnNaN()]
    gradient_fit_run(strategy, logdir, x, poisoned, global_batch, "replicas", callbacks=stop)
    gradient_fit_run(strategy, logdir, x, y, global_batch, "clean", callbacks=stop)


def run_scenario(name, logdir, strategy):
    """Runs one demo scenario into `logdir/name`.

    Args:
      name: one of `SCENARIOS`.
      logdir: the demo log directory.
      strategy: the `MirroredStrategy` to train with. Use one strategy per device set in a
        process: two strategies over the same devices reuse collective keys and clash.
    """
    import tensorflow as tf

    from tb_replica_plugin import inspect_dataset

    run_dir = os.path.join(logdir, name)
    if name == "balanced":
        fit_run(strategy, run_dir, examples=256, global_batch=32, epochs=3)
    elif name == "empty_last_shard":
        fit_run(strategy, run_dir, examples=66, global_batch=32, epochs=5)
    elif name == "batch_not_divisible":
        custom_loop_run(strategy, run_dir, examples=120, global_batch=30, epochs=3)
        x, y = _regression_data(120)
        dataset = tf.data.Dataset.from_tensor_slices((x, y)).batch(30)
        inspect_dataset(strategy, dataset, run_dir, steps=4)
    elif name == "shape_mismatch":
        shape_mismatch_run(strategy, run_dir)
    elif name == "dropout_fit":
        dropout_fit_run(strategy, run_dir)
    elif name == "generator_loop":
        generator_loop_run(strategy, run_dir)
    elif name in ("unsharded_pipeline", "sharded_pipeline"):
        pipeline_run(strategy, run_dir, sharded=name == "sharded_pipeline")
    elif name == "weight_drift":
        drift_run(strategy, os.path.join(run_dir, "skipped_allreduce"), all_reduce=False)
        drift_run(strategy, os.path.join(run_dir, "synchronized"), all_reduce=True)
        batchnorm_fit_run(strategy, run_dir)
    elif name == "gradient_outlier":
        gradient_outlier_runs(strategy, run_dir)
    elif name == "nan_replica":
        nan_replica_runs(strategy, run_dir)
    elif name == "gather_mismatch":
        watch_scenarios.gather_mismatch_run(strategy, run_dir, mismatch=True)
        watch_scenarios.gather_mismatch_run(strategy, run_dir, mismatch=False)
    elif name == "ragged_text":
        watch_scenarios.ragged_text_run(strategy, run_dir)
    elif name == "slow_replica":
        step_time_scenarios.slow_replica_run(strategy, run_dir)
    elif name == "crash":
        status_scenarios.crash_run(strategy, run_dir)
    else:
        raise ValueError(f"unknown scenario {name!r}; expected one of {SCENARIOS}")


def run_all(logdir, num_replicas=4):
    """Runs every scenario on `num_replicas` logical CPU replicas into `logdir`."""
    import tensorflow as tf

    strategy = tf.distribute.MirroredStrategy(configure_devices(num_replicas))
    for name in SCENARIOS:
        run_scenario(name, logdir, strategy)
