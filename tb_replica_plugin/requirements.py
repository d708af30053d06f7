"""What the write side needs: a TensorFlow of the supported window, whichever distribution.

The package names no TensorFlow distribution in `install_requires` (users have `tensorflow`,
`tensorflow-cpu`, `tensorflow[and-cuda]`, `tf-nightly` or a vendor build, and a plugin must not
install a second one beside it); the read side (the TensorBoard plugin, `tb-replica report`,
`load`) runs without TensorFlow. The write side (`ReplicaCallback`, `ReplicaProbe`,
`inspect_dataset`) checks here, when it is first imported, that TensorFlow is there and recent
enough, and says what was found and what to install when it is not.
"""

import re
import sys
import warnings

# The window checked in CI (docs/compatibility.md): TensorFlow 2.16 (the first with Keras 3)
# through 2.21.
OLDEST = (2, 16)
NEWEST = (2, 21)
WINDOW = f"{OLDEST[0]}.{OLDEST[1]}-{NEWEST[0]}.{NEWEST[1]}"
INSTALL_HINT = (
    f"pip install 'tensorflow>={OLDEST[0]}.{OLDEST[1]},<{NEWEST[0]}.{NEWEST[1] + 1}'"
    " (or tensorflow-cpu, tensorflow[and-cuda] of those versions), or "
    "pip install 'tb_replica_plugin[tf]' in a fresh environment"
)
# Versions already checked in this process (warned once if newer than the window).
_passed = set()


class TensorFlowRequirementError(ImportError):
    """TensorFlow is missing or older than the supported window (an `ImportError`)."""


def parse_version(version):
    """The (major, minor) of a TensorFlow version string.

    Args:
      version: e.g. "2.16.2", "2.19.0rc1", "2.22.0-dev20250601".

    Returns:
      A tuple of two ints, or None when the string does not start with "MAJOR.MINOR".
    """
    match = re.match(r"\s*(\d+)\.(\d+)", version or "")
    return (int(match.group(1)), int(match.group(2))) if match else None


def check_version(version, where="TensorFlow"):
    """Checks a TensorFlow version against the window.

    Args:
      version: the version string (`tf.__version__`).
      where: how to name what was found in messages (distribution and path).

    Returns:
      None inside the window, else the text of a warning for a version newer than the window
      (it may work; it is not checked).

    Raises:
      TensorFlowRequirementError: the version is older than the window or cannot be read.
    """
    parsed = parse_version(version)
    if parsed is None or parsed < OLDEST:
        raise TensorFlowRequirementError(
            f"tb_replica_plugin's ReplicaCallback, ReplicaProbe and inspect_dataset need "
            f"TensorFlow {WINDOW} (Keras 3 or tf_keras of the same minor version); found "
            f"{where} {version!r}. Install a supported one: {INSTALL_HINT}. "
            "(Reading logs - TensorBoard, tb-replica report, load - needs no TensorFlow.)"
        )
    if parsed > NEWEST:
        return (
            f"tb_replica_plugin: {where} {version} is newer than the versions it is checked "
            f"with ({WINDOW}); recording may work, but it is not tested there."
        )
    return None


def _distribution_of_tensorflow():
    """Which installed distributions provide the `tensorflow` package (e.g. "tensorflow-cpu")."""
    try:
        from importlib import metadata

        names = metadata.packages_distributions().get("tensorflow", [])
    except Exception:  # noqa: BLE001 - only makes the message more precise
        return ""
    return "/".join(sorted(set(names)))


def require_tensorflow():
    """Imports TensorFlow and checks that it is inside the supported window.

    Returns:
      The `tensorflow` module.

    Raises:
      TensorFlowRequirementError: TensorFlow is not installed, or is older than the window.
    """
    try:
        import tensorflow as tf
    except ModuleNotFoundError as error:
        if error.name != "tensorflow":
            raise
        raise TensorFlowRequirementError(
            f"tb_replica_plugin's ReplicaCallback, ReplicaProbe and inspect_dataset need "
            f"TensorFlow {WINDOW}; none is installed for {sys.executable}. Install one: "
            f"{INSTALL_HINT}. (Reading logs - TensorBoard, tb-replica report, load - needs no "
            "TensorFlow.)"
        ) from error
    version = getattr(tf, "__version__", "")
    if version in _passed:
        return tf
    parsed = parse_version(version)
    if parsed is None or not OLDEST <= parsed <= NEWEST:  # only then: names the distribution
        distribution = _distribution_of_tensorflow() or "unknown distribution"
        message = check_version(version, f"TensorFlow ({distribution}, {tf.__file__})")
        warnings.warn(message, RuntimeWarning, stacklevel=3)
    _passed.add(version)
    return tf
