"""The examples family."""
