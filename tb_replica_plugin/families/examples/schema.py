"""Tags and tensor layouts of the examples family (which examples each replica was fed).

Imported by the writer and the reader; no imports.
"""

# Written every `update_freq` steps. `data/examples`: int64 [R, 4 + K]: per replica the batch
# size, distinct examples, examples also on another replica (this step, then summed over the
# window) and a bottom-K sketch of the per-example fingerprints. `data/overlap`: int32 [3, R, R]:
# examples shared by two replicas (this step, summed over the window) and the window's steps with
# any shared example (counts beyond 2^31 - 1 written as that). Version 1 of this kind (read
# still): the same in int64.
TAG_DATA_EXAMPLES = "data/examples"
TAG_DATA_OVERLAP = "data/overlap"

KIND_DATA_EXAMPLES = "data_examples"
KIND_DATA_OVERLAP = "data_overlap"

TAGS = {TAG_DATA_EXAMPLES: KIND_DATA_EXAMPLES, TAG_DATA_OVERLAP: KIND_DATA_OVERLAP}

# Schema version written per kind (kinds not listed: 1); readers read every older version.
VERSIONS = {KIND_DATA_OVERLAP: 2}
