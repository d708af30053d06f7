"""The inputs family."""
