"""The read side: event files and data providers read into samples, no TensorFlow (see
docs/architecture.md, "Layers")."""
