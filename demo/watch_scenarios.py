"""Demo scenarios of the watch family (`ReplicaProbe.watch`) and of ragged inputs.

- `gather_mismatch`: a custom loop whose per-replica preprocessing truncates the token sequences
  to a length that depends on the replica (12 tokens on even replicas, 10 on odd ones), so the
  per-token outputs each replica returns are [4, 12] or [4, 10]: `strategy.gather(axis=0)` of
  them fails in TensorFlow ("Shape mismatch in the collective instance", shown by
  `tests/test_watch.py`; not called here, it would abort this process's collectives). Run
  `replicas` gives `gather_would_fail`; its clean twin `clean` truncates to 12 everywhere. Both
  watch what `strategy.run` returned with `explain=True` (`per_replica_result`).
- `ragged_text`: a text model trained by a custom loop on ragged token ids (`ragged_batch`; Keras
  3.15 `fit` cannot distribute ragged inputs, `tf_keras` `fit` can: see
  `tests/compat_scenarios.py`): 18 sentences, global batch 16 over 4 replicas, so the last batch
  gives the replicas [1, 1, 0, 0] rows (`empty_shard`); the inputs family records each replica's
  row count and token count, the watch family the logits.
"""

import os


def _token_model(strategy, vocabulary=64):
    import keras

    with strategy.scope():
        model = keras.Sequential(
            [keras.Input((None,), dtype="int32"), keras.layers.Embedding(vocabulary, 8)]
        )
        head = keras.layers.Dense(1)
        head.build((None, 8))
        optimizer = keras.optimizers.SGD(0.05)
        optimizer.build(model.trainable_variables + head.trainable_variables)
    return model, head, optimizer


def gather_mismatch_run(strategy, logdir, mismatch, steps=4, per_replica_batch=4):
    """Per-token logits of sequences truncated per replica (see the module docstring)."""
    import tensorflow as tf

    from tb_replica_plugin import ReplicaProbe

    num = strategy.num_replicas_in_sync
    global_batch = per_replica_batch * num
    tokens = tf.reshape(tf.range(steps * global_batch * 16) % 63 + 1, [-1, 16])
    dataset = strategy.experimental_distribute_dataset(
        tf.data.Dataset.from_tensor_slices(tokens).batch(global_batch)
    )
    model, head, optimizer = _token_model(strategy)
    run_dir = os.path.join(logdir, "replicas" if mismatch else "clean")
    probe = ReplicaProbe(run_dir, strategy, update_freq=1)

    @tf.function
    def train_step(batch):
        def step_fn(ids):
            replica = tf.distribute.get_replica_context().replica_id_in_sync_group
            # Per-replica preprocessing: the sequence length depends on the replica.
            length = 12 - 2 * (replica % 2) if mismatch else 12
            ids = ids[:, :length]
            with tf.GradientTape() as tape:
                logits = tf.squeeze(head(model(ids)), -1)  # [batch, length]
                loss = tf.reduce_sum(tf.square(logits)) / global_batch
            probe.watch("logits", logits)
            variables = model.trainable_variables + head.trainable_variables
            grads = tape.gradient(loss, variables)
            optimizer.apply_gradients(zip(grads, variables, strict=True))
            return logits

        return strategy.run(step_fn, args=(batch,))

    result = None
    for batch in dataset:
        result = train_step(batch)
    # What strategy.run returned at the last step, explained per replica.
    probe.watch("returned", result, step=steps - 1, explain=True)
    probe.close()


def ragged_text_run(strategy, logdir, sentences=18, global_batch=16, epochs=1):
    """A text model on ragged token ids, trained by a custom loop (see the module docstring)."""
    import tensorflow as tf

    from tb_replica_plugin import ReplicaProbe

    lengths = [i % 5 + 1 for i in range(sentences)]
    ids = tf.RaggedTensor.from_row_lengths(tf.range(sum(lengths)) % 63 + 1, lengths)
    labels = tf.constant([[float(n)] for n in lengths])
    dataset = strategy.experimental_distribute_dataset(
        tf.data.Dataset.from_tensor_slices((ids, labels)).ragged_batch(global_batch)
    )
    model, head, optimizer = _token_model(strategy)
    probe = ReplicaProbe(os.path.join(logdir, "replicas"), strategy, update_freq=1)

    @tf.function
    def train_step(tokens, targets):
        def step_fn(tokens, targets):
            probe.observe_inputs({"x": tokens, "y": targets})
            with tf.GradientTape() as tape:
                embedded = tf.ragged.map_flat_values(model.layers[0], tokens)
                pooled = tf.reduce_mean(embedded, axis=1)  # [rows, 8]
                if isinstance(pooled, tf.RaggedTensor):
                    pooled = pooled.to_tensor()
                logits = head(pooled)
                loss = tf.reduce_sum(tf.square(logits - targets)) / global_batch
            probe.watch("logits", logits)
            variables = model.trainable_variables + head.trainable_variables
            grads = tape.gradient(loss, variables)
            optimizer.apply_gradients(zip(grads, variables, strict=True))
            return loss

        return strategy.run(step_fn, args=(tokens, targets))

    for _ in range(epochs):
        for tokens, targets in dataset:
            train_step(tokens, targets)
    probe.close()
