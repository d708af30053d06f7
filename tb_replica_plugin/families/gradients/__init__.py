"""The gradients family."""
