"""The variables family."""
