"""Helpers shared by every family (no TensorFlow)."""
