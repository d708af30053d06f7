"""Tags and tensor layouts of the rng family (docs/data-format.md).

Imported by the writer and the reader; no imports.
"""

# Written every `update_freq` steps. `rng/streams`: int64 [G, R, 1 + W]: per generator and
# replica, the stream fingerprint of the next draw then the state words (zero-padded to W).
# `rng/generators`: scalar JSON string naming the G generators, written at the first written step
# of each layout.
TAG_RNG_STREAMS = "rng/streams"
TAG_RNG_GENERATORS = "rng/generators"

KIND_RNG_STREAMS = "rng_streams"
KIND_RNG_GENERATORS = "rng_generators"

TAGS = {TAG_RNG_STREAMS: KIND_RNG_STREAMS, TAG_RNG_GENERATORS: KIND_RNG_GENERATORS}
