"""The toy family's tag: int32 [R], a count per replica, written at some steps."""

TAG_TOY_COUNTS = "toy/counts"
KIND_TOY_COUNTS = "toy_counts"

TAGS = {TAG_TOY_COUNTS: KIND_TOY_COUNTS}
