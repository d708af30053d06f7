"""The step_time family."""
