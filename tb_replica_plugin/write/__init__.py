"""The write side: the probe's engine (writer, step axis, transfers, flushing, halting), which
reaches the families through the registry (see docs/architecture.md, "Layers")."""
