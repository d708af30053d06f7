"""The rng family."""
