"""Compatibility scenarios, written once against a `keras` module: Keras 3 or tf_keras.

Keras 3 runs them in the pytest process (`tests/test_compat.py`); tf_keras runs them here, in a
subprocess, because `tf.keras` is chosen once per process by `TF_USE_LEGACY_KERAS`, before
TensorFlow imports Keras:

    python tests/compat_scenarios.py LOGDIR --flavour tf_keras [--scenarios a,b,...]

Each scenario writes the run `LOGDIR/<scenario>` and returns a small dict of facts (the
warnings it raised, the optimizer's iterations, ...). The subprocess prints one JSON document
`{scenario: {"facts": {...}} | {"error": "..."}}` on its last stdout line; the tests read the
log dirs back with `tb_replica_plugin.load` and assert on both.
"""

import argparse
import json
import os
import sys
import traceback
import warnings

import numpy as np

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))

# Scenarios every flavour runs, and the ones only tf_keras can run (Keras 3.15 fit fails on them).
COMMON = (
    "default_strategy",
    "uneven_last",
    "multi_io_dataset",
    "class_weight_numpy",
    "frozen_generator",
    "mixed_precision",
    "central_storage",
    "one_device",
    "seeded_norms",
)
TF_KERAS_ONLY = ("first_batch_7", "steps_per_execution_2", "ragged_text")
# Adapter checks that write no run.
ADAPTER = ("gradient_hook", "traced_once")
# Ends its fit with an exception: after the others.
CRASH = ("crash_on_replica_1",)
# Changes the process's cluster (eager context connected to a server): runs last, on its own.
CLUSTER = ("parameter_server",)
# `crash_on_replica_1`: the step and replica whose batch holds the NaN its model asserts on.
CRASH_STEP = 3
CRASH_REPLICA = 1
FLAVOURS = ("tf_keras", "tf_keras_direct", "keras3")


def _record(fn):
    """Runs `fn()` and returns `(result, tb_replica_plugin warnings)`."""
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        result = fn()
    return result, [str(w.message) for w in caught if "tb_replica_plugin" in str(w.message)]


def _callback(logdir, name, **kwargs):
    from tb_replica_plugin import ReplicaCallback

    return ReplicaCallback(logdir, run_name=name, **kwargs)


def _dense_model(keras, strategy, features=3, outputs=1, **compile_kwargs):
    with strategy.scope():
        model = keras.Sequential([keras.Input((features,)), keras.layers.Dense(outputs)])
        compile_kwargs.setdefault("optimizer", "sgd")
        compile_kwargs.setdefault("loss", "mse")
        model.compile(**compile_kwargs)
    return model


def _xy(examples, features=3, seed=0):
    rng = np.random.default_rng(seed)
    x = rng.normal(size=(examples, features)).astype("float32")
    y = x.sum(axis=1, keepdims=True).astype("float32")
    return x, y


def _value(variable):
    import tensorflow as tf

    return tf.convert_to_tensor(variable).numpy()


def _fit_facts(model, callback_warnings):
    from tb_replica_plugin.keras import compat as keras_compat

    return {
        "iterations": keras_compat.optimizer_iterations(model),
        "warnings": callback_warnings,
    }


def uneven_last(keras, tf, strategy, logdir):
    """17 examples, global batch 8 on 2 replicas: [4, 4], [4, 4], [1, 0] (tf.data)."""
    x, y = _xy(17)
    model = _dense_model(keras, strategy)
    dataset = tf.data.Dataset.from_tensor_slices((x, y)).batch(8)
    _, caught = _record(
        lambda: model.fit(
            dataset, epochs=1, verbose=0, callbacks=[_callback(logdir, "uneven_last")]
        )
    )
    return _fit_facts(model, caught)


def multi_io_dataset(keras, tf, strategy, logdir):
    """Dict inputs, two named outputs, per-example sample weights, from tf.data.

    16 examples, global batch 8 → [4, 4] twice. Inputs are recorded as x/a, x/b, y/out_1,
    y/out_2 and sample_weight.
    """
    rng = np.random.default_rng(1)
    a = rng.normal(size=(16, 3)).astype("float32")
    b = rng.normal(size=(16, 2)).astype("float32")
    y1 = a.sum(axis=1, keepdims=True)
    y2 = b.sum(axis=1, keepdims=True)
    weights = np.linspace(0.5, 1.5, 16).astype("float32")
    with strategy.scope():
        in_a = keras.Input((3,), name="a")
        in_b = keras.Input((2,), name="b")
        joined = keras.layers.Concatenate()([in_a, in_b])
        out_1 = keras.layers.Dense(1, name="out_1")(joined)
        out_2 = keras.layers.Dense(1, name="out_2")(joined)
        model = keras.Model({"a": in_a, "b": in_b}, {"out_1": out_1, "out_2": out_2})
        model.compile(optimizer="sgd", loss={"out_1": "mse", "out_2": "mae"})
    dataset = tf.data.Dataset.from_tensor_slices(
        ({"a": a, "b": b}, {"out_1": y1, "out_2": y2}, weights)
    ).batch(8)
    _, caught = _record(
        lambda: model.fit(
            dataset, epochs=1, verbose=0, callbacks=[_callback(logdir, "multi_io_dataset")]
        )
    )
    return _fit_facts(model, caught)


def class_weight_numpy(keras, tf, strategy, logdir):
    """Numpy arrays with `class_weight`: Keras turns it into a per-example sample weight.

    12 examples, global batch 8 → [4, 4], then [2, 2].
    """
    rng = np.random.default_rng(2)
    x = rng.normal(size=(12, 4)).astype("float32")
    y = (np.arange(12) % 3).astype("int32")
    with strategy.scope():
        model = keras.Sequential([keras.Input((4,)), keras.layers.Dense(3)])
        model.compile(
            optimizer="sgd",
            loss=keras.losses.SparseCategoricalCrossentropy(from_logits=True),
        )
    _, caught = _record(
        lambda: model.fit(
            x,
            y,
            batch_size=8,
            epochs=1,
            verbose=0,
            shuffle=False,
            class_weight={0: 1.0, 1: 2.0, 2: 0.5},
            callbacks=[_callback(logdir, "class_weight_numpy")],
        )
    )
    return _fit_facts(model, caught)


def frozen_generator(keras, tf, strategy, logdir):
    """A frozen first layer, fit from a Python generator: 3 batches of 6 → [3, 3] each.

    Facts: whether the frozen kernel stayed the same and the trainable one moved.
    """

    def batches():
        # Endless, as Keras expects with `steps_per_epoch`: Keras 3 may read ahead of the steps.
        step = 0
        while True:
            x, y = _xy(6, seed=10 + step % 3)
            step += 1
            yield x, y

    with strategy.scope():
        frozen = keras.layers.Dense(4, name="frozen")
        frozen.trainable = False
        head = keras.layers.Dense(1, name="head")
        model = keras.Sequential([keras.Input((3,)), frozen, head])
        model.compile(optimizer="sgd", loss="mse")
    before = [_value(frozen.kernel), _value(head.kernel)]
    _, caught = _record(
        lambda: model.fit(
            batches(),
            steps_per_epoch=3,
            epochs=1,
            verbose=0,
            callbacks=[_callback(logdir, "frozen_generator")],
        )
    )
    facts = _fit_facts(model, caught)
    facts["frozen_unchanged"] = bool(np.array_equal(before[0], _value(frozen.kernel)))
    facts["head_changed"] = not np.array_equal(before[1], _value(head.kernel))
    return facts


def mixed_precision(keras, tf, strategy, logdir):
    """`mixed_float16` with its loss-scale optimizer: two fits of 16 float32 examples, batch 8.

    Both fits write the same run: steps 0-3, [4, 4] each (the second fit continues the axis even
    where the optimizer skipped an overflow step). The policy is global: it is set for this model
    only and restored afterwards.
    """
    from tb_replica_plugin.keras import compat as keras_compat

    previous = keras.mixed_precision.global_policy()
    keras.mixed_precision.set_global_policy("mixed_float16")
    try:
        x, y = _xy(16)
        with strategy.scope():
            model = keras.Sequential(
                [
                    keras.Input((3,)),
                    keras.layers.Dense(4),
                    keras.layers.Dense(1, dtype="float32"),
                ]
            )
            optimizer = keras.optimizers.SGD(0.01)
            if keras_compat.flavour_of(optimizer) == keras_compat.TF_KERAS:
                # tf_keras wraps it at compile too; explicit here to read the facts below.
                optimizer = keras.mixed_precision.LossScaleOptimizer(optimizer)
            model.compile(optimizer=optimizer, loss="mse")
        dataset = tf.data.Dataset.from_tensor_slices((x, y)).batch(8)

        def two_fits():
            for _ in range(2):
                model.fit(
                    dataset, epochs=1, verbose=0, callbacks=[_callback(logdir, "mixed_precision")]
                )

        _, caught = _record(two_fits)
    finally:
        keras.mixed_precision.set_global_policy(previous)
    info = keras_compat.optimizer_info(model.optimizer)
    facts = _fit_facts(model, caught)
    facts.update(
        optimizer=type(model.optimizer).__name__,
        loss_scaled=info.loss_scaled,
        grads_scaled_at_apply=info.grads_scaled_at_apply,
        iterations_count_skipped_steps=info.iterations_count_skipped_steps,
        loss_scale=float(info.loss_scale().numpy()),
        compute_dtype=str(model.layers[0].compute_dtype),
    )
    return facts


def central_storage(keras, tf, strategy, logdir):
    """`CentralStorageStrategy` over 2 CPUs (variables on cpu:0): 16 examples, batch 8."""
    central = tf.distribute.experimental.CentralStorageStrategy(
        compute_devices=["/cpu:0", "/cpu:1"], parameter_device="/cpu:0"
    )
    x, y = _xy(16)
    model = _dense_model(keras, central)
    dataset = tf.data.Dataset.from_tensor_slices((x, y)).batch(8)
    _, caught = _record(
        lambda: model.fit(
            dataset, epochs=1, verbose=0, callbacks=[_callback(logdir, "central_storage")]
        )
    )
    return _fit_facts(model, caught)


def default_strategy(keras, tf, strategy, logdir):
    """No strategy (the default one) with numpy arrays: 20 examples, batch 8 → [8], [8], [4]."""
    x, y = _xy(20)
    model = _dense_model(keras, tf.distribute.get_strategy())
    _, caught = _record(
        lambda: model.fit(
            x,
            y,
            batch_size=8,
            epochs=1,
            verbose=0,
            shuffle=False,
            callbacks=[_callback(logdir, "default_strategy")],
        )
    )
    return _fit_facts(model, caught)


def one_device(keras, tf, strategy, logdir):
    """`OneDeviceStrategy` on cpu:1 with numpy arrays: 12 examples, batch 8 → [8], [4]."""
    x, y = _xy(12)
    model = _dense_model(keras, tf.distribute.OneDeviceStrategy("/cpu:1"))
    _, caught = _record(
        lambda: model.fit(
            x,
            y,
            batch_size=8,
            epochs=1,
            verbose=0,
            shuffle=False,
            callbacks=[_callback(logdir, "one_device")],
        )
    )
    return _fit_facts(model, caught)


def ragged_text(keras, tf, strategy, logdir):
    """A text model on ragged token ids (tf_keras only: Keras 3.15 fit cannot distribute ragged
    inputs): 17 sentences of 1 to 3 tokens, `ragged_batch(8)` on 2 replicas, so the last batch
    is [1, 0] rows. Facts: each replica's rows and token counts per step, read by iterating the
    distributed dataset the way `fit` distributes it."""
    lengths = [i % 3 + 1 for i in range(17)]
    tokens = tf.RaggedTensor.from_row_lengths(tf.range(sum(lengths)) % 50 + 1, lengths)
    labels = np.array(lengths, "float32").reshape(17, 1)
    dataset = tf.data.Dataset.from_tensor_slices((tokens, labels)).ragged_batch(8)
    expected = []
    for x, _ in strategy.experimental_distribute_dataset(dataset):
        local = strategy.experimental_local_results(x)
        expected.append(
            {
                "nrows": [int(t.nrows()) for t in local],
                "values": [int(tf.size(t.flat_values)) for t in local],
            }
        )
    with strategy.scope():
        ids = keras.Input(shape=(None,), ragged=True, dtype="int32")
        embedded = keras.layers.Embedding(64, 4)(ids)
        pooled = keras.layers.Lambda(lambda t: tf.reduce_mean(t, axis=1))(embedded)
        model = keras.Model(ids, keras.layers.Dense(1)(pooled))
        model.compile(optimizer="sgd", loss="mse")
    _, caught = _record(
        lambda: model.fit(
            dataset, epochs=1, verbose=0, callbacks=[_callback(logdir, "ragged_text")]
        )
    )
    return dict(_fit_facts(model, caught), expected=expected)


def first_batch_7(keras, tf, strategy, logdir):
    """15 examples, global batch 7 on 2 replicas: [4, 3], [4, 3], [1, 0] (tf_keras only)."""
    x, y = _xy(15)
    model = _dense_model(keras, strategy)
    dataset = tf.data.Dataset.from_tensor_slices((x, y)).batch(7)
    _, caught = _record(
        lambda: model.fit(
            dataset, epochs=1, verbose=0, callbacks=[_callback(logdir, "first_batch_7")]
        )
    )
    return _fit_facts(model, caught)


def steps_per_execution_2(keras, tf, strategy, logdir):
    """`steps_per_execution=2` under MirroredStrategy, 2 epochs of 5 steps (tf_keras only)."""
    x, y = _xy(20)
    model = _dense_model(keras, strategy, steps_per_execution=2)
    dataset = tf.data.Dataset.from_tensor_slices((x, y)).batch(4)
    _, caught = _record(
        lambda: model.fit(
            dataset,
            epochs=2,
            verbose=0,
            callbacks=[_callback(logdir, "steps_per_execution_2", update_freq=1)],
        )
    )
    return _fit_facts(model, caught)


def _free_ports(count):
    import socket

    sockets = [socket.socket() for _ in range(count)]
    try:
        for sock in sockets:
            sock.bind(("localhost", 0))
        return [sock.getsockname()[1] for sock in sockets]
    finally:
        for sock in sockets:
            sock.close()


def parameter_server(keras, tf, strategy, logdir):
    """`ParameterServerStrategy` on an in-process cluster (1 ps, 2 workers, gRPC on localhost).

    tf_keras `fit` with a `tf.data.Dataset` (each worker iterates all of it: batches of 8 on
    both) records each worker as a replica (`keras.pss_fit`). Connecting to the cluster changes
    this process's eager context: run it last.
    """
    ports = _free_ports(3)
    cluster = tf.train.ClusterSpec(
        {"worker": [f"localhost:{p}" for p in ports[:2]], "ps": [f"localhost:{ports[2]}"]}
    )
    # As in TensorFlow's in-process cluster recipe: with fewer cores than tasks, workers need
    # more inter-op threads or their steps deadlock.
    config = tf.compat.v1.ConfigProto(inter_op_parallelism_threads=4)
    servers = [
        tf.distribute.Server(
            cluster, job_name=job, task_index=index, protocol="grpc", config=config
        )
        for job, index in (("worker", 0), ("worker", 1), ("ps", 0))
    ]
    resolver = tf.distribute.cluster_resolver.SimpleClusterResolver(cluster, rpc_layer="grpc")
    ps_strategy = tf.distribute.experimental.ParameterServerStrategy(resolver)
    x, y = _xy(32)
    model = _dense_model(keras, ps_strategy)
    dataset = tf.data.Dataset.from_tensor_slices((x, y)).repeat().batch(8)
    _, caught = _record(
        lambda: model.fit(
            dataset,
            epochs=1,
            steps_per_epoch=4,
            verbose=0,
            callbacks=[_callback(logdir, "parameter_server")],
        )
    )
    facts = _fit_facts(model, caught)
    facts["servers"] = len(servers)
    facts["run_dir_exists"] = os.path.exists(os.path.join(logdir, "parameter_server"))
    return facts


def gradient_hook(keras, tf, strategy, logdir):
    """`keras_compat.wrap_apply_gradients` on a float32 model and its `mixed_float16` twin.

    Same seeded initial weights, same batch of 8 (4 per replica); replica 1's examples and
    targets are replica 0's times 3, so its local gradient norm is several times larger whatever
    the initial weights. The hook records each replica's local gradient norm, before the
    all-reduce and without the loss scale. Facts: both norm pairs, the loss scale and where the
    unscaling happened.
    """
    from tb_replica_plugin.keras import compat as keras_compat

    x, y = _xy(4, seed=3)
    x, y = np.concatenate([x, 3 * x]), np.concatenate([y, 3 * y])
    dataset = tf.data.Dataset.from_tensor_slices((x, y)).batch(8)
    replicas = strategy.num_replicas_in_sync
    facts = {}
    weights = None
    for policy in ("float32", "mixed_float16"):
        previous = keras.mixed_precision.global_policy()
        keras.mixed_precision.set_global_policy(policy)
        try:
            with strategy.scope():
                model = keras.Sequential(
                    [
                        keras.Input((3,)),
                        keras.layers.Dense(
                            4, kernel_initializer=keras.initializers.GlorotUniform(seed=1)
                        ),
                        keras.layers.Dense(
                            1,
                            dtype="float32",
                            kernel_initializer=keras.initializers.GlorotUniform(seed=2),
                        ),
                    ]
                )
                optimizer = keras.optimizers.SGD(0.01)
                if policy == "mixed_float16":
                    # A small initial scale: no overflow step in this one-step test.
                    optimizer = keras.mixed_precision.LossScaleOptimizer(
                        optimizer, initial_scale=1024.0
                    )
                model.compile(optimizer=optimizer, loss="mse")
            if weights is None:
                weights = model.get_weights()
            else:
                model.set_weights(weights)
            with tf.init_scope(), tf.device("/cpu:0"):
                norms = tf.Variable(tf.zeros([replicas]), trainable=False)

            def record(strategy, norm, norms=norms):
                values = strategy.experimental_local_results(norm)
                norms.assign(tf.stack([tf.reshape(v, []) for v in values]))

            def hook(grads, variables, info):
                norm = tf.linalg.global_norm([tf.cast(g, tf.float32) for g in grads])
                tf.distribute.get_replica_context().merge_call(record, args=(norm,))

            restore = keras_compat.wrap_apply_gradients(model.optimizer, hook)
            model.fit(dataset, epochs=1, verbose=0)
            restore()
        finally:
            keras.mixed_precision.set_global_policy(previous)
        info = keras_compat.optimizer_info(model.optimizer)
        facts[policy] = {
            "norms": norms.numpy().tolist(),
            "loss_scale": float(info.loss_scale().numpy()),
            "grads_scaled_at_apply": info.grads_scaled_at_apply,
            "restored": "apply_gradients" not in model.optimizer.__dict__,
        }
    return facts


def seeded_norms(keras, tf, strategy, logdir):
    """One seeded model and data, in float32 and `mixed_float16`: runs `seeded_norms/<policy>`.

    Constant initial weights and unshuffled data make every flavour compute the same numbers, so
    the recorded per-replica gradient norms can be compared across Keras flavours and between
    the policies (the loss scale undone). 16 examples, global batch 8, 2 steps, every step logged.
    """
    from tb_replica_plugin.keras import compat as keras_compat

    x, y = _xy(16, seed=5)
    y = y * 0.1  # small errors: the float16 gradients stay far from overflow under the loss scale
    dataset = tf.data.Dataset.from_tensor_slices((x, y)).batch(8)
    previous = keras.mixed_precision.global_policy()
    facts = {}
    for policy in ("float32", "mixed_float16"):
        keras.mixed_precision.set_global_policy(policy)
        try:
            with strategy.scope():
                model = keras.Sequential(
                    [
                        keras.Input((3,)),
                        keras.layers.Dense(4, kernel_initializer=keras.initializers.Constant(0.1)),
                        keras.layers.Dense(
                            1, dtype="float32", kernel_initializer=keras.initializers.Constant(0.2)
                        ),
                    ]
                )
                optimizer = keras.optimizers.SGD(0.01)
                tf_keras_flavour = keras_compat.flavour_of(optimizer) == keras_compat.TF_KERAS
                if policy == "mixed_float16" and tf_keras_flavour:
                    optimizer = keras.mixed_precision.LossScaleOptimizer(optimizer)
                model.compile(optimizer=optimizer, loss="mse")
            callback = _callback(os.path.join(logdir, "seeded_norms"), policy, update_freq=1)
            _, caught = _record(
                lambda model=model, callback=callback: model.fit(
                    dataset, epochs=1, verbose=0, shuffle=False, callbacks=[callback]
                )
            )
        finally:
            keras.mixed_precision.set_global_policy(previous)
        facts[policy] = _fit_facts(model, caught)
    return facts


def traced_once(keras, tf, strategy, logdir):
    """Two fits with one callback: how often the model's layers run while the step is traced.

    A layer's Python `call` runs once per replica at each trace of the train step (and when the
    model is built or Keras traces it symbolically, outside `fit`'s step).
    """
    calls = []

    class Counting(keras.layers.Layer):
        def call(self, inputs):
            calls.append(1)  # Python: runs only while a graph is traced
            return inputs

    x, y = _xy(32)
    with strategy.scope():
        model = keras.Sequential([keras.Input((3,)), Counting(), keras.layers.Dense(1)])
        # Slots (Adam's moments) are what tf_keras would create inside the first trace. Named, so
        # that later Keras 3 Adam optimizers of this process keep their default names.
        model.compile(optimizer=keras.optimizers.Adam(name="traced_once_adam"), loss="mse")
    callback = _callback(logdir, "traced_once")
    before = len(calls)
    model.fit(x, y, batch_size=8, epochs=2, verbose=0, callbacks=[callback])
    first = len(calls) - before
    model.fit(x, y, batch_size=8, epochs=1, verbose=0, callbacks=[callback])
    return {"first_fit": first, "second_fit": len(calls) - before - first}


def crash_on_replica_1(keras, tf, strategy, logdir):
    """`fit` on 2 replicas whose first layer asserts its inputs are finite; one example of step 3
    (global batch 8: rows 24..31, replica 1 gets 28..31) holds a NaN, so the step fails on
    replica 1 and `fit` raises `InvalidArgumentError`. Facts: the error's class and the line of
    the assertion (the user frame the crash finding must name)."""
    import inspect

    class FiniteInputs(keras.layers.Layer):
        def call(self, inputs):
            return tf.debugging.assert_all_finite(inputs, "an input is not finite")

    x, y = _xy(64)
    x[CRASH_STEP * 8 + 4 * CRASH_REPLICA + 1, 0] = np.nan
    with strategy.scope():
        model = keras.Sequential([keras.Input((3,)), FiniteInputs(), keras.layers.Dense(1)])
        model.compile(optimizer="sgd", loss="mse")
    dataset = tf.data.Dataset.from_tensor_slices((x, y)).batch(8)
    try:
        model.fit(dataset, verbose=0, callbacks=[_callback(logdir, "crash_on_replica_1")])
    except tf.errors.InvalidArgumentError as error:
        lines, first = inspect.getsourcelines(FiniteInputs.call)
        assert_line = first + next(i for i, line in enumerate(lines) if "assert_all" in line)
        return {"error": type(error).__name__, "file": __file__, "line": assert_line}
    raise AssertionError("fit did not raise")


SCENARIOS = {
    fn.__name__: fn
    for fn in (
        crash_on_replica_1,
        uneven_last,
        multi_io_dataset,
        class_weight_numpy,
        frozen_generator,
        mixed_precision,
        central_storage,
        default_strategy,
        one_device,
        first_batch_7,
        steps_per_execution_2,
        ragged_text,
        parameter_server,
        gradient_hook,
        traced_once,
        seeded_norms,
    )
}


def run(names, keras, tf, strategy, logdir):
    """Runs scenarios by name; a failing scenario is reported, the others still run.

    Returns:
      `{name: {"facts": dict} | {"error": str}}`.
    """
    results = {}
    for name in names:
        try:
            results[name] = {"facts": SCENARIOS[name](keras, tf, strategy, logdir)}
        except Exception as error:  # noqa: BLE001 - reported to the test, which fails on it
            results[name] = {"error": f"{type(error).__name__}: {error}"}
            traceback.print_exc()
    return results


def main():
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("logdir")
    parser.add_argument(
        "--flavour",
        choices=FLAVOURS,
        default="tf_keras",
        help="tf_keras: TF_USE_LEGACY_KERAS=1 and tf.keras; tf_keras_direct: `import tf_keras` "
        "with Keras 3 as tf.keras (ReplicaCallback then derives from Keras 3's Callback); "
        "keras3: Keras 3",
    )
    parser.add_argument(
        "--scenarios", default=",".join(COMMON + ADAPTER + TF_KERAS_ONLY + CRASH + CLUSTER)
    )
    args = parser.parse_args()
    os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")
    if args.flavour == "tf_keras":
        os.environ["TF_USE_LEGACY_KERAS"] = "1"  # before TensorFlow imports Keras
    else:
        os.environ.pop("TF_USE_LEGACY_KERAS", None)
    sys.path.insert(0, REPO)
    from demo import scenarios as demo_scenarios

    devices = demo_scenarios.configure_devices(2)
    import tensorflow as tf

    if args.flavour == "tf_keras_direct":
        import tf_keras as keras
    else:
        keras = tf.keras
    strategy = tf.distribute.MirroredStrategy(devices)
    results = run(args.scenarios.split(","), keras, tf, strategy, args.logdir)
    from tb_replica_plugin.keras import compat as keras_compat

    results["_meta"] = {"keras_version": keras_compat.keras_module().__version__}
    print(json.dumps(results), flush=True)


if __name__ == "__main__":
    main()
