"""RNG family: per replica, the state of each random generator and a fingerprint of its stream.

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

import tensorflow as tf

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
