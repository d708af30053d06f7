"""Collectors: one module per stat family, each computing small per-replica stats in-graph.

A collector is given the per-replica values of one step in cross-replica context (a list over
replicas) and returns the tensors the probe writes. Collectors never write summaries themselves.
"""
