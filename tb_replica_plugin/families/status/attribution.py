"""Who an exception names: TensorFlow's error text attributed to replicas, devices and workers.

Used at run time by the status family's write side (to build the EXCEPTION object of an "end" or
"exception" event, `schema.py`) and by the tests. Pure Python: no TensorFlow, no numpy.

TensorFlow says where an op failed only in its text:

- `Detected at node replica_1/sequential_1/check_1/VerifyFinite/CheckNumerics defined at (most
  recent call last):` then the Python frames where that op was created (`defined_at`), and the
  same node again as `[[{{node replica_1/...}}]]`. Under `MirroredStrategy` the ops of local
  replica N > 0 are named `replica_N/...`; replica 0's carry no prefix, so a failure there names
  no replica (its device may, see `exception_record`).
- Devices: `/job:localhost/replica:0/task:0/device:GPU:3`, `/device:CPU:0`.
- Workers of a multi-worker job: `/job:worker/task:1`, and after a worker dies, the coordination
  service's `The following tasks are unhealthy (stopped sending heartbeats):` followed by one
  task per line.

A FRAME is `{"file", "line", "function", "user"}`; `user` is `is_user_file(file)`.
"""

import functools
import os
import re
import site
import sys
import sysconfig

from tb_replica_plugin.families.status import schema

# Installed packages whose frames are never the user's code (their top-level import names).
FRAMEWORK_PACKAGES = (
    "tensorflow",
    "keras",
    "tf_keras",
    "tensorboard",
    "absl",
    "numpy",
    "IPython",
    "ipykernel",
    "tb_replica_plugin",
)
# Pseudo-file names of code that is not the user's (`<ipython-input-...>`, `<stdin>` are).
NON_USER_PSEUDO_FILES = ("<frozen ", "<string>", "<__array_function__")
# The innermost frames always kept when a stack is cut to `schema.MAX_FRAMES`.
INNERMOST_KEPT = 16
FIRST_LINE_CHARS = 500
# How many `__cause__` / `__context__` links `exception_record` follows.
CHAIN_DEPTH = 5
# Room kept for the line `cut_message` puts where it cut.
CUT_MARK_CHARS = 40

_NODE_DETECTED = re.compile(r"Detected at node\s+'?([\w./>-]+?)'?(?=\s|$)")
_NODE_BRACKETS = re.compile(r"\{\{node ([^}\s]+)\}\}")
_REPLICA_PREFIX = re.compile(r"(?<!\w)replica_(\d+)/")
_DEVICE = re.compile(
    r"((?:/job:[\w-]+)?(?:/replica:\d+)?(?:/task:\d+)?)/device:([A-Za-z_]+):(\d+)", re.IGNORECASE
)
_TASK = re.compile(r"/job:([\w-]+)(?:/replica:\d+)?/task:(\d+)")
_TASK_LIST_LINE = re.compile(r"(?:[\s,]*/job:[\w-]+(?:/replica:\d+)?/task:\d+)+[\s,.]*")
_UNHEALTHY = "The following tasks are unhealthy (stopped sending heartbeats):"
_DEFINED_AT = "defined at (most recent call last):"
_FILE_LINE = re.compile(r'^\s*File "([^"]*)", line (\d+), in (.+?)\s*$')
_FUNCTION_NODE = re.compile(r"^\{\{function_node [^}]*\}\}\s*")
_ROOT_ERROR = re.compile(r"^\(\d+\)\s+")
_STATUS_CODE = re.compile(r"^[A-Z][A-Z_]+:\s+")
_NODE_SUFFIX = re.compile(r"\s*\[\[.*\]\]\s*$")
_NOISE_LINES = re.compile(
    r"^(?:Graph execution error:|\d+ root error\(s\) found\.|\d+ successful operations\.|"
    r"\d+ derived errors ignored\.(?: \[Op:[^\]]*\])?|\[\[.*\]\]|Detected at node .*|"
    r"\[… \d+ characters cut …\])$"
)
_SITE_LAYOUT = re.compile(
    r"[\\/](?:site|dist)-packages[\\/](?P<top>[^\\/]+?)(?:\.py)?(?:[\\/]|$)", re.IGNORECASE
)
_STDLIB_LAYOUT = re.compile(r"[\\/]lib[\\/]python\d+(?:\.\d+)?t?[\\/]", re.IGNORECASE)


def parse_error_text(message):
    """What an exception's text names: the failing node, replicas, devices, tasks and frames.

    Args:
      message: the exception's text (`str(error)`); any string, however malformed.

    Returns:
      A dict:
      - `node`: the failing op's node name (after "Detected at node ", else in
        "[[{{node NAME}}]]"), or None;
      - `local_replicas`: sorted local replica indices from the `replica_N/` prefixes of the
        failing nodes ("Detected at node NAME", "[[{{node NAME}}]]"); only when those name none,
        of every node name in the text (the nodes an error passed through on its way out of the
        step, `[[StatefulPartitionedCall/replica_3/...]]`, name other replicas too);
      - `devices`: device names in order of first mention, as written with the device type
        upper-cased (`/job:worker/replica:0/task:1/device:GPU:0`, `/device:GPU:1`);
      - `tasks`: `[{"task_type", "task_index"}]` of every `/job:<type>/.../task:<k>`, sorted;
      - `unhealthy_tasks`: the tasks listed after "The following tasks are unhealthy (stopped
        sending heartbeats):", sorted;
      - `defined_at`: the FRAMEs of the first "defined at (most recent call last):" block,
        outermost first;
      - `first_line`: the first meaningful line ("" if none): TensorFlow's
        `{{function_node ...}}` prefix, "Graph execution error:", the "Detected at node" block,
        a root error's "(0) INVALID_ARGUMENT: " and a trailing "[[{{node ...}}]]" left out.

    Example:
      >>> parsed = parse_error_text("... Detected at node replica_1/dense/CheckNumerics ...")
      >>> parsed["node"], parsed["local_replicas"]
      ('replica_1/dense/CheckNumerics', [1])
    """
    text = message if isinstance(message, str) else str(message)
    return {
        "node": failing_node(text),
        "local_replicas": failing_replicas(text),
        "devices": mentioned_devices(text),
        "tasks": _sorted_tasks(_TASK.findall(text)),
        "unhealthy_tasks": unhealthy_tasks(text),
        "defined_at": defined_at_frames(text),
        "first_line": first_line(text),
    }


def failing_replicas(text):
    """Sorted local replica indices of the failing nodes, else of every `replica_N/` prefix."""
    nodes = [m.group(1) for p in (_NODE_DETECTED, _NODE_BRACKETS) for m in p.finditer(text)]
    found = {int(n) for node in nodes for n in _REPLICA_PREFIX.findall(node)}
    if not found and not nodes:
        found = {int(n) for n in _REPLICA_PREFIX.findall(text)}
    return sorted(found)


def failing_node(text):
    """The failing op's node name in TensorFlow's text, or None (see `parse_error_text`)."""
    for pattern in (_NODE_DETECTED, _NODE_BRACKETS):
        match = pattern.search(text)
        if match:
            return match.group(1)
    return None


def mentioned_devices(text):
    """Device names mentioned in `text`, in order of first mention, type upper-cased."""
    devices = []
    for match in _DEVICE.finditer(text):
        prefix, kind, index = match.groups()
        name = f"{prefix}/device:{kind.upper()}:{index}"
        if name not in devices:
            devices.append(name)
    return devices


def _sorted_tasks(pairs):
    unique = {(task_type, int(index)) for task_type, index in pairs}
    return [{"task_type": t, "task_index": i} for t, i in sorted(unique)]


def unhealthy_tasks(text):
    """The tasks TensorFlow's coordination service lists as unhealthy (sorted task dicts).

    Every occurrence of "The following tasks are unhealthy (stopped sending heartbeats):" is
    followed by task names, one or more per line (the first may share the marker's line), up to
    the first line that holds anything else.

    Example:
      >>> unhealthy_tasks(f"{_UNHEALTHY}\\n/job:worker/replica:0/task:1\\nThe tasks have crashed.")
      [{'task_type': 'worker', 'task_index': 1}]
    """
    found = []
    start = text.find(_UNHEALTHY)
    while start >= 0:
        lines = text[start + len(_UNHEALTHY) :].split("\n")
        for position, line in enumerate(lines):
            if not line.strip() and position == 0:
                continue  # the marker ends its line
            if not _TASK_LIST_LINE.fullmatch(line):
                break
            found.extend(_TASK.findall(line))
        start = text.find(_UNHEALTHY, start + len(_UNHEALTHY))
    return _sorted_tasks(found)


def defined_at_frames(text):
    """The FRAMEs of the first "defined at (most recent call last):" block, outermost first."""
    start = text.find(_DEFINED_AT)
    if start < 0:
        return []
    frames = []
    for line in text[start + len(_DEFINED_AT) :].split("\n")[1:]:
        match = _FILE_LINE.match(line)
        if match:
            frames.append(make_frame(match.group(1), int(match.group(2)), match.group(3)))
        elif line.strip():
            break
    return frames


def first_line(text):
    """The first meaningful line of an exception's text ("" if none; see `parse_error_text`)."""
    for raw in text.split("\n"):
        line = _FUNCTION_NODE.sub("", raw.strip())
        if not line or _NOISE_LINES.match(line) or _FILE_LINE.match(line):
            continue
        line = _NODE_SUFFIX.sub("", _STATUS_CODE.sub("", _ROOT_ERROR.sub("", line)))
        line = " ".join(line.split())
        if line:
            return line[:FIRST_LINE_CHARS]
    return ""


def _normalised(path):
    return os.path.normcase(os.path.normpath(path))


def _inside(path, root):
    return path == root or path.startswith(root.rstrip(os.sep) + os.sep)


@functools.cache
def _roots():
    """`(stdlib dirs, site-packages dirs, this package's dir)` of the running interpreter,
    normalised, each also as its real path."""
    paths = sysconfig.get_paths()
    stdlib = {paths.get("stdlib"), paths.get("platstdlib")}
    sites = {paths.get("purelib"), paths.get("platlib")}
    sites.update(getattr(site, "getsitepackages", list)())
    if site.ENABLE_USER_SITE:
        sites.add(site.getusersitepackages())
    sites.update(p for p in sys.path if os.path.basename(p) in ("site-packages", "dist-packages"))
    own = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

    def both(dirs):
        return tuple({_normalised(v) for d in dirs if d for v in (d, os.path.realpath(d))})

    return both(stdlib), both(sites), both([own])


@functools.lru_cache(maxsize=4096)
def is_user_file(path):
    """Whether a frame's file is the user's code.

    Not the user's: Python's own (the interpreter's standard library, `<frozen ...>`,
    `<string>`), an installed package of `FRAMEWORK_PACKAGES` (TensorFlow, Keras, tf_keras,
    TensorBoard, absl, numpy, IPython, ipykernel, this package), and this package's own
    directory (also when installed editable from a checkout). The running interpreter's
    `sysconfig`/`site` paths decide; a path of another machine (a text recorded elsewhere) is
    judged by its layout (`.../site-packages/<package>/...`, `.../lib/python3.X/...`).
    Everything else is: scripts, notebooks (`<ipython-input-...>`), other installed packages.

    Args:
      path: a frame's `co_filename`.

    Returns:
      A bool (False for an empty path).

    Example:
      >>> is_user_file("/home/me/train.py"), is_user_file(threading.__file__)
      (True, False)
    """
    if not path:
        return False
    if path.startswith("<"):
        return not path.startswith(NON_USER_PSEUDO_FILES)
    stdlib, sites, own = _roots()
    normalised = _normalised(path)
    if any(_inside(normalised, root) for root in own):
        return False
    for root in sites:
        if _inside(normalised, root) and normalised != root:
            top = normalised[len(root.rstrip(os.sep)) + 1 :].split(os.sep)[0]
            return _top_level_name(top) not in _framework_names()
    layout = _SITE_LAYOUT.search(path)
    if layout:
        return _top_level_name(layout.group("top")) not in _framework_names()
    if any(_inside(normalised, root) for root in stdlib):
        return False
    return not _STDLIB_LAYOUT.search(path)


@functools.cache
def _framework_names():
    return frozenset(os.path.normcase(name).lower() for name in FRAMEWORK_PACKAGES)


def _top_level_name(entry):
    """`numpy` for `numpy`, `six` for `six.py` (an installed module's import name)."""
    return os.path.normcase(entry.removesuffix(".py")).lower()


def make_frame(file, line, function):
    """A FRAME dict: `{"file", "line", "function", "user": is_user_file(file)}`."""
    file = str(file)
    return {"file": file, "line": int(line), "function": str(function), "user": is_user_file(file)}


def cut_frames(frames, limit=schema.MAX_FRAMES):
    """At most `limit` frames, outermost first: the innermost `INNERMOST_KEPT`, then the user
    frames (innermost first), then the next innermost ones, in their original order."""
    if len(frames) <= limit:
        return list(frames)
    inner_first = list(range(len(frames) - 1, -1, -1))
    innermost = inner_first[:INNERMOST_KEPT]
    user = [i for i in inner_first if frames[i]["user"] and i not in innermost]
    rest = [i for i in inner_first if i not in innermost and not frames[i]["user"]]
    kept = sorted((innermost + user + rest)[:limit])
    return [frames[i] for i in kept]


def frames_from_traceback(tb):
    """The FRAMEs of a traceback, outermost first (cut as `cut_frames` does).

    Args:
      tb: a traceback object (`error.__traceback__`), or None.

    Returns:
      A list of FRAME dicts (at most `schema.MAX_FRAMES`).

    Example:
      >>> try:
      ...     1 / 0
      ... except ZeroDivisionError as error:
      ...     frames = frames_from_traceback(error.__traceback__)
      >>> frames[-1]["function"]
      '<module>'
    """
    frames = []
    while tb is not None:
        code = tb.tb_frame.f_code
        frames.append(make_frame(code.co_filename, tb.tb_lineno, code.co_name))
        tb = tb.tb_next
    return cut_frames(frames)


def frames_from_stack(frame):
    """The FRAMEs of a thread's stack from its innermost frame, outermost first.

    Args:
      frame: a frame object (`sys._current_frames()[ident]`, `sys._getframe()`), or None.

    Returns:
      A list of FRAME dicts (at most `schema.MAX_FRAMES`, cut as `cut_frames` does).

    Example:
      >>> frames_from_stack(sys._getframe())[-1]["function"]
      '<module>'
    """
    frames = []
    while frame is not None:
        code = frame.f_code
        frames.append(make_frame(code.co_filename, frame.f_lineno, code.co_name))
        frame = frame.f_back
    frames.reverse()
    return cut_frames(frames)


def user_frame(frames):
    """The innermost user FRAME of `frames`, or None.

    Args:
      frames: FRAME dicts, outermost first (a traceback, a stack, `defined_at`); a frame
        without a `user` key is judged by `is_user_file`.

    Returns:
      The last frame whose `user` is true, or None when none is.

    Example:
      >>> user_frame([{"file": "/x/train.py", "line": 9, "function": "call", "user": True}])
      {'file': '/x/train.py', 'line': 9, 'function': 'call', 'user': True}
    """
    for frame in reversed(frames or []):
        user = frame.get("user")
        if user is None:
            user = is_user_file(frame.get("file", ""))
        if user:
            return frame
    return None


def _names_anything(parsed):
    keys = ("node", "local_replicas", "devices", "tasks", "unhealthy_tasks")
    return any(parsed[key] for key in keys)


def _text_of(error):
    try:
        return str(error)
    except Exception:  # noqa: BLE001 - a broken __str__ must not hide the crash
        return repr(error)


def _inner_naming(error):
    """The parse of the first exception down `__cause__` (else `__context__`, unless
    suppressed) whose text names a node, replica, device or task; None if none does."""
    seen = {id(error)}
    current = error
    for _ in range(CHAIN_DEPTH):
        inner = current.__cause__
        if inner is None and not current.__suppress_context__:
            inner = current.__context__
        if inner is None or id(inner) in seen:
            return None
        seen.add(id(inner))
        parsed = parse_error_text(_text_of(inner))
        if _names_anything(parsed):
            return parsed
        current = inner
    return None


def _device_key(name):
    """`(job, task, type, index)` of a device name; job and task None when not written."""
    match = _DEVICE.search(name)
    if match is None:
        return None
    prefix, kind, index = match.groups()
    job = re.search(r"/job:([\w-]+)", prefix)
    task = re.search(r"/task:(\d+)", prefix)
    return (
        job.group(1) if job else None,
        int(task.group(1)) if task else None,
        kind.upper(),
        int(index),
    )


def _same_device(mentioned, local):
    """Whether a mentioned device is a local device (parts not written match anything)."""
    a, b = _device_key(mentioned), _device_key(local)
    if a is None or b is None:
        return False
    return all(x is None or y is None or x == y for x, y in zip(a, b, strict=True))


def local_replicas_of(parsed, devices):
    """Local replica indices an error names: its `replica_N/` prefixes, else the positions in
    `devices` (the run's replica devices, in local replica order) of the devices it mentions.

    A device mention is used only when no node prefix names a replica: the host's `CPU:0`
    appears in many texts that are not about replica 0.
    """
    if parsed["local_replicas"]:
        return list(parsed["local_replicas"])
    return [
        index
        for index, local in enumerate(devices or [])
        if any(_same_device(mentioned, local) for mentioned in parsed["devices"])
    ]


def cut_message(text, limit=schema.MESSAGE_CHARS):
    """`text` in at most `limit` characters: its first lines and its last ones, with a line
    saying how many characters were cut between them (TensorFlow puts the failing node and the
    "defined at" frames first, the root errors last).

    Example:
      >>> len(cut_message("x\\n" * 5000)) <= schema.MESSAGE_CHARS
      True
    """
    if len(text) <= limit:
        return text
    head = text[: limit // 4]
    head = head[: head.rfind("\n")] if "\n" in head else head
    tail = text[len(text) - (limit - len(head) - CUT_MARK_CHARS) :]
    tail = tail[tail.find("\n") + 1 :] if "\n" in tail else tail
    return f"{head}\n[… {len(text) - len(head) - len(tail)} characters cut …]\n{tail}"


def exception_record(error, step=None, replicas_of=None, devices=None):
    """The EXCEPTION object of the status schema for an exception.

    Attribution comes from the exception's own text. When that text names nothing (no node,
    replica, device or task), the first exception down its chain that does (`__cause__`, else
    `__context__` unless suppressed; at most `CHAIN_DEPTH` links) gives `node`, `defined_at`,
    `replicas`, `devices`, `tasks` and `unhealthy_tasks`; `class`, `module`, `message` and
    `frames` stay the outer exception's (a wrapper such as `RuntimeError("training failed")
    from error` keeps what TensorFlow said underneath). The whole text is parsed; `message`
    keeps at most `schema.MESSAGE_CHARS` characters of it (`cut_message`).

    Args:
      error: the exception (with its `__traceback__` if it was raised).
      step: the training step it was raised at, or None.
      replicas_of: maps a local replica index to its global replica id (default: identity).
      devices: the run's replica devices in local replica order (the probe's `devices`), used
        when the text names a device but no `replica_N/` node.

    Returns:
      `{"class", "module", "message", "frames", "defined_at", "node", "replicas", "devices",
      "tasks", "unhealthy_tasks", "step"}`, JSON-ready.

    Example:
      >>> record = exception_record(error, step=3, replicas_of=lambda local: 2 + local)
      >>> record["class"], record["replicas"], record["step"]   # "replica_1/..." on worker 1
      ('InvalidArgumentError', [3], 3)
    """
    text = _text_of(error)
    parsed = parse_error_text(text)
    if not _names_anything(parsed):
        parsed = _inner_naming(error) or parsed
    to_global = replicas_of or (lambda local: local)
    replicas = sorted({int(to_global(local)) for local in local_replicas_of(parsed, devices)})
    return {
        "class": type(error).__name__,
        "module": type(error).__module__,
        "message": cut_message(text),
        "frames": frames_from_traceback(error.__traceback__),
        "defined_at": parsed["defined_at"],
        "node": parsed["node"],
        "replicas": replicas,
        "devices": parsed["devices"],
        "tasks": parsed["tasks"],
        "unhealthy_tasks": parsed["unhealthy_tasks"],
        "step": None if step is None else int(step),
    }
