"""The supported-window matrix: install this checkout into a user's TensorFlow and test it there.

    python .ci/window.py [--all] [--only NAME ...]

For each entry (a Python of pyenv, a TensorFlow distribution and the tf-keras of its minor
version), in a venv kept under the cache directory (`TB_REPLICA_WINDOW_DIR`, default
`~/.cache/tb_replica_plugin/window`: outside the repository, so nothing of it is linted or
committed):

1. the venv holds the user's stack: TensorFlow and tf-keras as a user installs them (and what a
   working TensorBoard needs there, `Entry.extra`), and pytest.
   A kept venv is reused only if it was built for the same entry and its stack packages are the
   versions recorded when it was built (else it is built anew: idempotent, like .ci/setup.sh);
2. `pip install --dry-run --report` of the checkout must install no TensorFlow, TensorBoard,
   Keras, tf-keras, numpy, protobuf or ml-dtypes (asserted, not printed);
3. `pip install` of the checkout, with its dependencies; the stack packages must be unchanged
   (TensorFlow still the pre-installed version) and `pip check` clean;
4. the core subset (`tests/test_window.py`) runs against the installed copy, which is then
   uninstalled (the next run's dry run meets the user's stack again).

Exit status 0 only when every entry passed; the last line counts tests (`N passed, N failed`).
"""

import argparse
import contextlib
import dataclasses
import fcntl
import glob
import json
import os
import re
import shutil
import subprocess
import sys
import tempfile
import time

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
# What installing the plugin must never install, upgrade or downgrade (the user's stack).
STACK = re.compile(r"^(tensorflow.*|tensorboard.*|keras|tf-keras|numpy|protobuf|ml-dtypes)$")
PIP_TIMEOUT = 1800
TEST_TIMEOUT = 1200
LOCK_TIMEOUT = 3600


@dataclasses.dataclass(frozen=True)
class Entry:
    """One user environment of the window.

    Attributes:
      python: the pyenv Python (major.minor) of the venv.
      tensorflow: the TensorFlow requirement the user installed, e.g. "tensorflow-cpu==2.16.2".
      tf_keras: the tf-keras requirement (the same minor as TensorFlow).
      extra: the rest of the user's stack where TensorFlow does not bring it: TensorBoard from
        2.21 on (TensorFlow 2.21 no longer depends on it); `setuptools<82` for TensorBoard
        2.16-2.20, which import `pkg_resources` (gone from setuptools 82; a Python 3.12 or 3.13
        venv has no setuptools, so TensorFlow's requirement installs the newest).
      ci: whether `.ci/run` runs it (the others run with `--all`).
      label: tells apart two entries of one Python and TensorFlow (it ends the venv's name).
    """

    python: str
    tensorflow: str
    tf_keras: str
    extra: tuple = ()
    ci: bool = True
    label: str = ""

    @property
    def name(self):
        """The venv's directory name, e.g. "py3.10-tensorflow-cpu-2.16.2"."""
        return f"py{self.python}-{self.tensorflow.replace('==', '-')}{self.label}"

    def expected(self):
        """The versions `tests/test_window.py` must find (`TB_REPLICA_WINDOW_EXPECT`)."""
        return {
            "python": self.python,
            "tensorflow": self.tensorflow.split("==")[1],
            "tf_keras": self.tf_keras.split("==")[1],
        }


ENTRIES = (
    Entry("3.10", "tensorflow-cpu==2.16.2", "tf-keras==2.16.0"),
    Entry("3.12", "tensorflow-cpu==2.18.1", "tf-keras==2.18.0", ("setuptools<82",)),
    # The newest Python of the window (TensorFlow has cp313 wheels from 2.20 on); the same
    # stack on 3.11 is `--all`'s (the full suite already runs TensorFlow 2.21 on 3.11).
    Entry("3.13", "tensorflow-cpu==2.21.0", "tf-keras==2.21.0", ("tensorboard==2.21.0",)),
    Entry("3.11", "tensorflow-cpu==2.21.0", "tf-keras==2.21.0", ("tensorboard==2.21.0",), ci=False),
    Entry("3.11", "tensorflow-cpu==2.17.1", "tf-keras==2.17.0", ci=False),
    Entry("3.10", "tensorflow-cpu==2.19.1", "tf-keras==2.19.0", ci=False),
    Entry("3.12", "tensorflow-cpu==2.20.0", "tf-keras==2.20.1", ("setuptools<82",), ci=False),
    # The oldest numpy TensorFlow 2.16 accepts (setup.py's lower bound).
    Entry(
        "3.10",
        "tensorflow-cpu==2.16.2",
        "tf-keras==2.16.0",
        ("numpy==1.23.5",),
        ci=False,
        label="-numpy-1.23.5",
    ),
)


class WindowError(Exception):
    """An entry failed: the message says which step and why."""


def _run(command, timeout, **kwargs):
    """Runs `command`; returns the CompletedProcess (text), raising WindowError on failure."""
    result = subprocess.run(command, capture_output=True, text=True, timeout=timeout, **kwargs)
    if result.returncode != 0:
        raise WindowError(
            f"{' '.join(command)} exited {result.returncode}:\n"
            f"{result.stdout[-4000:]}\n{result.stderr[-4000:]}"
        )
    return result


def find_python(version):
    """The interpreter of `version` ("3.10"): pyenv's newest patch release, else `pythonX.Y`.

    Raises:
      WindowError: neither exists.
    """
    root = os.environ.get("PYENV_ROOT") or os.path.expanduser("~/.pyenv")
    if shutil.which("pyenv"):
        root = subprocess.run(["pyenv", "root"], capture_output=True, text=True).stdout.strip()
    candidates = sorted(
        glob.glob(os.path.join(root, "versions", f"{version}.*", "bin", "python")),
        key=lambda path: int(path.split(os.sep)[-3].split(".")[2].split("-")[0] or 0),
    )
    found = candidates[-1] if candidates else shutil.which(f"python{version}")
    if not found:
        raise WindowError(f"no Python {version} (pyenv versions under {root}, or on PATH)")
    return found


def normalize(name):
    """A distribution name as PEP 503 compares them ("ML_Dtypes" -> "ml-dtypes")."""
    return re.sub(r"[-_.]+", "-", name).lower()


def stack_versions(python):
    """`{name: version}` of the stack packages installed in the venv of `python`."""
    listed = _run([python, "-m", "pip", "list", "--format=json"], 300).stdout
    versions = {}
    for package in json.loads(listed):
        name = normalize(package["name"])
        if STACK.match(name):
            versions[name] = package["version"]
    return versions


def ensure_venv(entry, root):
    """The venv of `entry` under `root` with the user's stack, reused when intact.

    Returns:
      `(python path, {stack package: version} as built, seconds spent building or 0.0)`.
    """
    venv = os.path.join(root, entry.name)
    python = os.path.join(venv, "bin", "python")
    stamp = os.path.join(venv, "window-stack.json")
    if os.path.exists(stamp) and os.path.exists(python):
        with open(stamp) as f:
            recorded = json.load(f)
        if recorded["entry"] == json.loads(json.dumps(dataclasses.asdict(entry))):
            if stack_versions(python) == recorded["stack"]:
                return python, recorded["stack"], 0.0
            print(f"window: {entry.name}: stack changed since it was built, rebuilding")
    started = time.monotonic()
    shutil.rmtree(venv, ignore_errors=True)
    _run([find_python(entry.python), "-m", "venv", venv], 300)
    _run([python, "-m", "pip", "install", "-q", "--upgrade", "pip"], PIP_TIMEOUT)
    _run(
        [python, "-m", "pip", "install", "-q", entry.tensorflow, entry.tf_keras, *entry.extra]
        + ["pytest"],
        PIP_TIMEOUT,
    )
    stack = stack_versions(python)
    with open(stamp, "w") as f:  # written last: a venv without it is rebuilt
        json.dump({"entry": dataclasses.asdict(entry), "stack": stack}, f, indent=1)
    return python, stack, time.monotonic() - started


def copy_checkout(destination):
    """The working tree without venvs, build outputs or VCS data (a stale `build/` would leak
    deleted modules into the wheel)."""
    shutil.copytree(
        REPO,
        destination,
        ignore=shutil.ignore_patterns(
            ".venv", ".git", "node_modules", "__pycache__", "*.egg-info", "build", "demo_logs"
        ),
    )
    return destination


def check_dry_run(python, source, scratch):
    """`pip install --dry-run` of the checkout installs nothing of the user's stack.

    Returns:
      The `name==version` list pip would install.

    Raises:
      WindowError: it would install a stack package.
    """
    report = os.path.join(scratch, "dry-run.json")
    _run(
        [python, "-m", "pip", "install", "-q", "--dry-run", "--report", report, source],
        PIP_TIMEOUT,
    )
    with open(report) as f:
        installs = json.load(f)["install"]
    names = {normalize(i["metadata"]["name"]): i["metadata"]["version"] for i in installs}
    would = [f"{name}=={version}" for name, version in sorted(names.items())]
    touched = [w for w in would if STACK.match(w.split("==")[0])]
    if touched:
        raise WindowError(f"pip install --dry-run would install {touched} (all: {would})")
    if "tb-replica-plugin" not in names:
        raise WindowError(f"the dry run does not install the plugin: {would}")
    return would


def install_and_check(python, source, stack):
    """`pip install` of the checkout with its dependencies; the stack must stay as it was.

    Raises:
      WindowError: a stack package changed, or `pip check` finds a broken requirement.
    """
    _run([python, "-m", "pip", "install", "-q", source], PIP_TIMEOUT)
    after = stack_versions(python)
    if after != stack:
        changed = {k: (stack.get(k), v) for k, v in after.items() if stack.get(k) != v}
        raise WindowError(f"pip install changed the user's stack: {changed}")
    _run([python, "-m", "pip", "check"], 300)


def run_subset(entry, python, scratch):
    """The core subset against the installed copy; returns pytest's `(passed, failed)`."""
    env = dict(os.environ)
    env.update(
        TB_REPLICA_INSTALLED_COPY="1",
        TB_REPLICA_WINDOW_EXPECT=json.dumps(entry.expected()),
        PYTHONDONTWRITEBYTECODE="1",
    )
    env.pop("PYTHONPATH", None)
    command = [
        python,
        "-m",
        "pytest",
        os.path.join(REPO, "tests", "test_window.py"),
        "-c",
        os.path.join(REPO, "pyproject.toml"),
        "--rootdir",
        REPO,
        "-q",
        "-p",
        "no:cacheprovider",
    ]
    result = subprocess.run(
        command, cwd=scratch, env=env, capture_output=True, text=True, timeout=TEST_TIMEOUT
    )
    tail = result.stdout.strip().splitlines()[-1] if result.stdout.strip() else ""
    passed = int((re.search(r"(\d+) passed", tail) or [0, 0])[1])
    failed = int((re.search(r"(\d+) (failed|error)", tail) or [0, 0])[1])
    if result.returncode != 0:
        print(result.stdout[-6000:] + result.stderr[-3000:])
        failed = max(failed, 1)
    return passed, failed


@contextlib.contextmanager
def locked(path, timeout=LOCK_TIMEOUT):
    """Holds an exclusive lock on `path` (another run of this script on the same venv waits).

    Raises:
      WindowError: the lock was not free within `timeout` seconds.
    """
    with open(path, "w") as handle:
        deadline = time.monotonic() + timeout
        while True:
            try:
                fcntl.flock(handle, fcntl.LOCK_EX | fcntl.LOCK_NB)
                break
            except BlockingIOError:
                if time.monotonic() > deadline:
                    raise WindowError(f"{path} still locked after {timeout} s") from None
                time.sleep(2)
        try:
            yield
        finally:
            fcntl.flock(handle, fcntl.LOCK_UN)


def run_entry(entry, root):
    """Steps 1-4 of one entry (its venv locked meanwhile); prints one line.

    The plugin is uninstalled afterwards, so the next run's dry run meets the user's stack again.

    Returns:
      `(passed, failed, seconds)`: pytest's counts, or `(0, 1, ...)` when a step before the tests
      failed.
    """
    started = time.monotonic()
    python = None
    try:
        with locked(os.path.join(root, entry.name + ".lock")):
            try:
                python, stack, built = ensure_venv(entry, root)
                with tempfile.TemporaryDirectory(prefix="tb_replica_window_") as scratch:
                    source = copy_checkout(os.path.join(scratch, "src"))
                    would = check_dry_run(python, source, scratch)
                    install_and_check(python, source, stack)
                    passed, failed = run_subset(entry, python, scratch)
            finally:
                if python is not None:
                    uninstall = [python, "-m", "pip", "uninstall", "-q", "-y", "tb_replica_plugin"]
                    subprocess.run(uninstall, capture_output=True, timeout=300)
    except (WindowError, subprocess.TimeoutExpired) as error:
        print(f"window: {entry.name}: FAILED: {error}")
        return 0, 1, time.monotonic() - started
    seconds = time.monotonic() - started
    venv = f"built in {built:.0f} s" if built else "reused"
    kept = ", ".join(f"{name} {version}" for name, version in sorted(stack.items()))
    print(
        f"window: {entry.name}: {passed} passed, {failed} failed in {seconds:.0f} s (venv "
        f"{venv}); the dry run would install {', '.join(would)}; stack kept: {kept}",
        flush=True,
    )
    return passed, failed, seconds


def main(argv=None):
    """Runs the entries (`.ci/run`'s: those with `ci=True`).

    Args:
      argv: the arguments (default: `sys.argv[1:]`).

    Returns:
      The exit status: 0 when every entry passed, else 1.
    """
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--all", action="store_true", help="also the entries CI skips")
    parser.add_argument("--only", nargs="*", default=None, help="entry names to run")
    args = parser.parse_args(argv)
    root = os.environ.get("TB_REPLICA_WINDOW_DIR") or os.path.join(
        os.environ.get("XDG_CACHE_HOME") or os.path.expanduser("~/.cache"),
        "tb_replica_plugin",
        "window",
    )
    os.makedirs(root, exist_ok=True)
    entries = [e for e in ENTRIES if e.ci or args.all]
    if args.only is not None:
        unknown = sorted(set(args.only) - {e.name for e in ENTRIES})
        if unknown:
            parser.error(f"unknown entries {unknown}; known: {[e.name for e in ENTRIES]}")
        entries = [e for e in ENTRIES if e.name in args.only]
    started = time.monotonic()
    passed = failed = 0
    for entry in entries:
        entry_passed, entry_failed, _ = run_entry(entry, root)
        passed, failed = passed + entry_passed, failed + entry_failed
    print(f"window: {len(entries)} entries in {time.monotonic() - started:.0f} s ({root})")
    print(f"window: {passed} passed, {failed} failed")
    return 1 if failed or not entries else 0


if __name__ == "__main__":
    sys.exit(main())
