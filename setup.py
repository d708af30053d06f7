"""Packaging of tb_replica_plugin (TensorBoard finds the plugin through the entry point)."""

import pathlib

import setuptools

setuptools.setup(
    name="tb_replica_plugin",
    version="0.1.0",
    description="TensorBoard plugin: distributed TensorFlow training, replica by replica.",
    long_description=pathlib.Path(__file__).with_name("README.md").read_text(encoding="utf-8"),
    long_description_content_type="text/markdown",
    packages=setuptools.find_packages(include=["tb_replica_plugin", "tb_replica_plugin.*"]),
    package_data={"tb_replica_plugin": ["static/*", "http_api.md"]},
    # The Pythons checked (.ci/window.py; 3.13 needs TensorFlow 2.20 or newer, the first with its
    # wheels). No upper bound: a newer Python is refused by TensorFlow's wheels, not here.
    python_requires=">=3.10",
    classifiers=[
        "Programming Language :: Python :: 3",
        "Programming Language :: Python :: 3.10",
        "Programming Language :: Python :: 3.11",
        "Programming Language :: Python :: 3.12",
        "Programming Language :: Python :: 3.13",
    ],
    # No TensorFlow distribution: the user's (tensorflow, tensorflow-cpu, tensorflow[and-cuda],
    # tf-nightly, a vendor build) is used as it is, and the read side runs without one. The
    # write side checks its version at import (tb_replica_plugin/requirements.py). Lower bounds:
    # the oldest TensorBoard checked (2.16, both loaders), numpy as TensorFlow 2.16 requires it,
    # werkzeug as TensorBoard does; no upper bounds, so pip never replaces what the user's
    # TensorFlow brought (docs/compatibility.md).
    install_requires=[
        "tensorboard>=2.16",
        "numpy>=1.23.5",
        "werkzeug>=1.0.1",
        # CRC-32C in C: the bulk reader verifies every record's checksums as TensorFlow's reader
        # does, without TensorFlow; TensorBoard's pure-Python CRC would take minutes per GB.
        "google-crc32c>=1.5",
    ],
    extras_require={
        # A fresh environment: the newest TensorFlow of the supported window.
        "tf": ["tensorflow>=2.16,<2.22"],
        # tf-keras: the compatibility tests run the callback under Keras 2 too; users need it
        # only if they train with tf_keras (of their TensorFlow's minor version).
        # ipython: a custom loop run cell by cell in a real IPython shell (tests/notebook_child.py).
        "test": ["pytest", "playwright", "ruff", "hypothesis", "tf-keras>=2.16,<2.22", "ipython"],
    },
    entry_points={
        "tensorboard_plugins": ["replicas = tb_replica_plugin.plugin:ReplicasPlugin"],
        "console_scripts": ["tb-replica = tb_replica_plugin.cli:main"],
    },
)
