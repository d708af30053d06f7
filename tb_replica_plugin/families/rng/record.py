"""RNG family, write side: per replica, each generator's state and a fingerprint of its stream.

State alone does not tell whether replicas draw the same numbers: a `tf.random.Generator` created
under `strategy.scope()` has the same (mirrored) state on every replica, yet each replica folds its
replica id into the key and draws its own stream. So, besides the state, every replica computes
in replica context the first `STREAM_WORDS` 64-bit words its *next* draw would use, exactly as the
generator would derive them on that replica, but statelessly (the generator is not advanced):

- Keras `SeedGenerator` (Keras 3, TF backend): every random op draws statelessly from
  `seed = floormod(state, int32.max - 1)` (`keras.src.backend.tensorflow.random._cast_seed`), then
  advances the state. The words are `tf.random.stateless_uniform([4], seed, dtype=int64)`.
- `tf.random.Generator`: the next draw uses counter = `state[:counter_size]` and key =
  `state[counter_size]` hashed with the replica id in replica context
  (`Generator._preprocess_key`). The words are `StatelessRandomUniformFullIntV2(key, counter)`.

The stream fingerprint is `tf.fingerprint` (farmhash64) of those words: equal fingerprints on two
replicas mean they draw the same numbers at that step.
"""

import dataclasses
import functools
import hashlib
import json

import tensorflow as tf

from tb_replica_plugin.core.recorder import Recorder as RecorderBase
from tb_replica_plugin.families.rng import schema

STREAM_WORDS = 4
KERAS_SEED_GENERATOR = "keras.SeedGenerator"
TF_GENERATOR = "tf.random.Generator"
TF_GLOBAL_NAME = "tf.random.global_generator"
KERAS_GLOBAL_NAME = "keras.global_seed_generator"


@dataclasses.dataclass
class GeneratorInfo:
    """One random generator to observe.

    Attributes:
      name: the name shown (layer name for a layer's SeedGenerator, the dict key otherwise).
      kind: `KERAS_SEED_GENERATOR` or `TF_GENERATOR`.
      layer: name of the Keras layer owning it, or None.
      layer_class: class name of that layer (e.g. "Dropout"), or None.
      mirrored: whether its state is one mirrored variable (so replicas should hold equal states).
      state_size: number of int64 state words.
      obj: the generator itself.
    """

    name: str
    kind: str
    layer: str | None
    layer_class: str | None
    mirrored: bool
    state_size: int
    obj: object

    def to_json(self):
        return {
            "name": self.name,
            "kind": self.kind,
            "layer": self.layer,
            "layer_class": self.layer_class,
            "mirrored": self.mirrored,
            "state_size": self.state_size,
        }


def _keras_seed_generator_class():
    try:
        import keras

        return keras.random.SeedGenerator
    except (ImportError, AttributeError):
        return None


def _state_variable(generator):
    """The (possibly distributed) tf variable holding a generator's state."""
    if isinstance(generator, tf.random.Generator):
        return generator.state
    state = generator.state
    return getattr(state, "value", state)


def _info(name, generator, layer=None):
    seed_class = _keras_seed_generator_class()
    if isinstance(generator, tf.random.Generator):
        kind = TF_GENERATOR
    elif seed_class is not None and isinstance(generator, seed_class):
        kind = KERAS_SEED_GENERATOR
    else:
        raise TypeError(
            f"{name!r} is a {type(generator).__name__}; expected a tf.random.Generator or a "
            "keras.random.SeedGenerator"
        )
    variable = _state_variable(generator)
    return GeneratorInfo(
        name=str(name),
        kind=kind,
        layer=layer.name if layer is not None else None,
        layer_class=type(layer).__name__ if layer is not None else None,
        mirrored=isinstance(variable, tf.distribute.DistributedValues),
        state_size=int(variable.shape[0]),
        obj=generator,
    )


def _layer_generators(root):
    """`(name, seed_generator, layer)` of every SeedGenerator tracked by a Keras layer tree."""
    layers = [root]
    flatten = getattr(root, "_flatten_layers", None)
    if flatten is not None:
        layers = list(flatten(include_self=True, recursive=True))
    found = []
    for layer in layers:
        generators = list(getattr(layer, "_seed_generators", None) or [])
        for index, generator in enumerate(generators):
            name = layer.name if len(generators) == 1 else f"{layer.name}/{index}"
            found.append((name, generator, layer))
    return found


def global_generators():
    """The global generators that already exist: `[(name, generator)]` (none are created)."""
    found = []
    try:
        from tensorflow.python.ops import stateful_random_ops

        if stateful_random_ops.global_generator is not None:
            found.append((TF_GLOBAL_NAME, stateful_random_ops.global_generator))
    except (ImportError, AttributeError):
        pass
    try:
        from keras.src.backend.common import global_state

        keras_global = global_state.get_global_attribute("global_seed_generator")
        if keras_global is not None:
            found.append((KERAS_GLOBAL_NAME, keras_global))
    except (ImportError, AttributeError):
        pass
    return found


def find_generators(sources, include_global=True):
    """The generators to observe, from user sources and (optionally) the global generators.

    Args:
      sources: None, a `tf.random.Generator` or `keras.random.SeedGenerator`, a Keras layer or
        model (every SeedGenerator of its layers, named by layer), a dict `{name: generator or
        layer}`, or a list of these.
      include_global: also observe the TensorFlow global generator and Keras's global seed
        generator when they exist (they are never created here).

    Returns:
      A list of `GeneratorInfo`, each generator once (first name wins).

    Raises:
      TypeError: if a source is none of the above.

    Example:
      >>> [g.name for g in find_generators(model, include_global=False)]
      ['dropout']
    """
    pairs = []

    def add(name, source):
        seed_class = _keras_seed_generator_class()
        if isinstance(source, tf.random.Generator) or (
            seed_class is not None and isinstance(source, seed_class)
        ):
            pairs.append(_info(name or getattr(source, "name", None) or "generator", source))
        elif hasattr(source, "_flatten_layers") or hasattr(source, "_seed_generators"):
            for layer_name, generator, layer in _layer_generators(source):
                full = f"{name}/{layer_name}" if name else layer_name
                pairs.append(_info(full, generator, layer))
        elif isinstance(source, dict):
            for key in sorted(source, key=str):
                add(str(key), source[key])
        elif isinstance(source, (list, tuple)):
            for item in source:
                add(None, item)
        else:
            raise TypeError(
                f"cannot observe {type(source).__name__}: pass tf.random.Generator, "
                "keras.random.SeedGenerator, a Keras layer or model, or a dict/list of them"
            )

    if sources is not None:
        add(None, sources)
    if include_global:
        for name, generator in global_generators():
            pairs.append(_info(name, generator))
    seen, unique = set(), []
    for info in pairs:
        if id(info.obj) not in seen:
            seen.add(id(info.obj))
            unique.append(info)
    return unique


def _fingerprint64(words):
    """farmhash64 of an int64 vector, as an int64 scalar."""
    digest = tf.fingerprint(tf.expand_dims(tf.bitcast(words, tf.uint8), 0))
    return tf.reshape(tf.bitcast(digest, tf.int64), [1])


def _keras_row(generator):
    state = tf.cast(tf.identity(_state_variable(generator)), tf.int64)
    seed = tf.cast(tf.math.floormod(state, tf.int32.max - 1), tf.int32)
    words = tf.random.stateless_uniform(
        [STREAM_WORDS], seed=seed, minval=None, maxval=None, dtype=tf.int64
    )
    return state, words


def _tf_generator_row(generator):
    from tensorflow.python.ops import stateful_random_ops

    state = tf.identity(generator.state)
    algorithm = generator.algorithm
    counter_size = stateful_random_ops._get_counter_size(algorithm)  # noqa: SLF001
    counter = tf.bitcast(state[:counter_size], tf.uint64)
    key = tf.bitcast(state[counter_size : counter_size + 1], tf.uint64)
    key = generator._preprocess_key(key)  # noqa: SLF001 - the replica-id fold of the next draw
    words = tf.raw_ops.StatelessRandomUniformFullIntV2(
        shape=[STREAM_WORDS],
        key=key,
        counter=counter,
        alg=tf.cast(algorithm, tf.int32),
        dtype=tf.uint64,
    )
    return tf.cast(state, tf.int64), tf.bitcast(words, tf.int64)


def local_streams(infos, width):
    """This replica's rows, in replica context: int64 [G, 1 + width].

    Column 0 is the stream fingerprint of the generator's next draw on this replica, columns
    1.. its state words, zero-padded to `width`.
    """
    rows = []
    for info in infos:
        if info.kind == KERAS_SEED_GENERATOR:
            state, words = _keras_row(info.obj)
        else:
            state, words = _tf_generator_row(info.obj)
        state = tf.pad(state, [[0, width - info.state_size]])
        rows.append(tf.concat([_fingerprint64(words), state], axis=0))
    return tf.stack(rows)


# Slots of the family's packed int64 counters: step of `last`, steps since the last write, id of
# the last written generators document.
_LAST_STEP, _WIN_COUNT, _DOC = range(3)
# The family's value in a step's transfer.
_STREAMS = ("rng", "streams")


def _document_id(document):
    return 1 + int.from_bytes(
        hashlib.blake2b(document.encode("utf-8"), digest_size=7).digest(), "little"
    )


class Recorder(RecorderBase):
    """State and writes of the rng family."""

    name = "rng"

    def create_state(self):
        self.variable("counters", [-1, 0, 0], tf.int64)
        # The last step's streams [G, R, 1 + W] (G and W known when a step is traced).
        self.variable("last", tf.zeros([0, 0, 0], tf.int64), shape=tf.TensorShape(None))
        self._document = None
        self._layout = None

    def observe(self, generators, step, include_global):
        probe = self.probe
        infos = find_generators(generators, include_global=include_global)
        if not infos:
            probe.warn_once("rng_none", "tb_replica_plugin: observe_rng found no generator.")
            return
        width = max(info.state_size for info in infos)
        layout = (len(infos), width)
        if self._layout is not None and self._layout != layout:
            raise ValueError(
                f"rng: {len(infos)} generators of {width} state words, first recorded with "
                f"{self._layout[0]} of {self._layout[1]}; use one probe per layout"
            )
        self._layout = layout
        document = json.dumps(
            {"generators": [info.to_json() for info in infos], **probe.static}, sort_keys=True
        )
        self._document = document
        local = functools.partial(local_streams, infos, width)
        merge = functools.partial(self._merge, document=document, step=step)
        probe.run_local_then_merge(local, merge, ())

    def _merge(self, strategy, rows, *, document, step):
        """Cross-replica part: every replica's rows into the step's transfer."""
        probe = self.probe
        transfer = None
        try:
            per_replica = probe.local_values(strategy, rows)  # [R] of [G, 1 + W]
            transfer = probe.transfer()
            for packet, replica_rows in zip(transfer.packets, per_replica, strict=True):
                with tf.device(packet.device):
                    packet.ints(_STREAMS, tf.reshape(replica_rows, [-1]))
            shape = per_replica[0].shape.as_list()
            deliver = functools.partial(self._deliver, document=document, step=step, shape=shape)
            transfer.on_host(self.name, deliver)
        except Exception as error:  # noqa: BLE001
            if transfer is not None:
                transfer.drop(self.name)
            probe.warn_failed("rng", error)
            return
        probe.ship(transfer)

    def _deliver(self, delivery, *, document, step, shape):
        probe = self.probe
        try:
            with tf.device("/cpu:0"):
                flat = delivery.value(_STREAMS)  # [R, G * (1 + W)]
                streams = tf.transpose(tf.reshape(flat, [-1, *shape]), [1, 0, 2])  # [G, R, 1 + W]
            step_value = probe.step_of(delivery, self.name, step)
            counters = tf.unstack(self.state["counters"].read_value())
            if probe.update_freq is None:
                count = counters[_WIN_COUNT] + 1
                doc = counters[_DOC]
            else:
                write = probe.gated(probe.logged(step_value))
                doc = self._write(streams, step_value, document, write, counters[_DOC])
                count = tf.where(write, tf.constant(0, tf.int64), counters[_WIN_COUNT] + 1)
            self.state["last"].assign(streams)
            self.state["counters"].assign(tf.stack([step_value, count, doc]))
        except Exception as error:  # noqa: BLE001
            probe.warn_failed("rng", error)

    def _write(self, streams, step, document, condition, written_doc):
        """Queues the streams, and the generators document when it differs from the last one
        written; returns the id of the last written document.

        The document (names of the G rows) changes only when the step is traced again with other
        generators, so it is written once per layout, not at every logged step.
        """
        probe = self.probe
        document_id = _document_id(document)
        probe.write(
            condition, schema.TAG_RNG_STREAMS, lambda: streams, step, schema.KIND_RNG_STREAMS
        )
        new_document = tf.logical_and(condition, tf.not_equal(written_doc, document_id))
        probe.write(
            new_document,
            schema.TAG_RNG_GENERATORS,
            lambda: tf.constant(document),
            step,
            schema.KIND_RNG_GENERATORS,
        )
        return tf.where(new_document, tf.constant(document_id, tf.int64), written_doc)

    def write_window(self):
        counters = self.state.get("counters")
        if counters is None or self._document is None:
            return
        values = counters.numpy()
        if int(values[_WIN_COUNT]) == 0:
            return
        with tf.init_scope():
            doc = self._write(
                self.state["last"].read_value(),
                int(values[_LAST_STEP]),
                self._document,
                True,
                int(values[_DOC]),
            )
        counters.assign(tf.stack([values[_LAST_STEP], 0, doc]))

    def fit_step(self, fit):
        """Keras `fit` with `rng=True`: the generators of the model (and `generators`), before
        the model's step, so it sees the state each draw of this step starts from; nothing when
        the model uses no generator that can be observed."""
        if not fit.options.rng:
            return None, None
        generators = fit.options.generators
        sources = [fit.model] if generators is None else [fit.model, generators]
        if not find_generators(sources):
            return None, None
        probe = self.probe
        return (lambda batch: probe.observe_rng(sources)), None


class Recording:
    """`ReplicaProbe` methods of the rng family."""

    def observe_rng(self, generators=None, step=None, include_global=True):
        """Records, per replica, the state and the stream fingerprint of random generators.

        Call it at the start of the step, before the model draws, in replica context (inside
        `strategy.run`) or in cross-replica context (it then runs itself through `strategy.run`).
        The stream fingerprint hashes the first numbers the generator's *next* draw would give
        on each replica, computed statelessly (the generator is not advanced), so equal
        fingerprints mean the replicas draw the same numbers (see `families/rng/record.py`).
        A failure warns once and never stops training.

        Args:
          generators: what to observe: a `tf.random.Generator`, a `keras.random.SeedGenerator`,
            a Keras layer or model (every SeedGenerator of its layers, named by layer, e.g.
            Dropout's), a dict `{name: any of these}`, or a list of them. Create
            `tf.random.Generator`s under `strategy.scope()` so each replica has its own stream.
          step: the step to record at; when omitted, the step of the step axis (see
            `observe_inputs`).
          include_global: also observe TensorFlow's global generator and Keras's global seed
            generator if they already exist (they are never created here).

        Example:
          ```python
          with strategy.scope():
              noise = tf.random.Generator.from_seed(1)

          def step_fn(x):
              probe.observe_rng({"noise": noise, "model": model})
              x = x + noise.normal(tf.shape(x))
              ...
          ```
        """
        if not self.build():
            return
        try:
            self.recorder("rng").observe(generators, step, include_global)
        except Exception as error:  # noqa: BLE001 - must never break training
            self.warn_failed("rng", error)
