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
    python_requires=">=3.11",
    install_requires=["tensorflow>=2.21,<2.22", "tensorboard>=2.21,<2.22", "werkzeug", "numpy"],
    # tf-keras: the compatibility tests run the callback under Keras 2 too; users need it only
    # if they train with tf_keras.
    extras_require={
        "test": ["pytest", "playwright", "ruff", "hypothesis", "tf-keras>=2.21,<2.22"],
    },
    entry_points={
        "tensorboard_plugins": ["replicas = tb_replica_plugin.plugin:ReplicasPlugin"],
        "console_scripts": ["tb-replica = tb_replica_plugin.cli:main"],
    },
)
