"""The README and docs/ stay true: every example runs, and the findings tables match the code.

- Every ```python block of README.md and docs/*.md runs in its own subprocess, in a temporary
  directory shared by the blocks of one document (as cwd), after a prelude that splits the CPU
  into 2 logical devices and makes `tf.distribute.MirroredStrategy()` (no devices given) use
  them. A block is skipped only when the line right before it is a visible marker
  `<!-- not run: REASON -->` (e.g. it needs a TPU or several processes).
- Every ```bash / ```sh block that names `tb-replica` runs with `bash -euo pipefail` in the same
  directory, after the python blocks of its document that come before it, with the venv's
  `bin/` first on PATH.
- The findings tables of docs/findings.md and README.md list exactly the kinds of
  `read.judge.finding_kinds()` with their severity and thresholds, and docs/findings.md lists
  every field of `analysis.Thresholds` with its default.
"""

import dataclasses
import glob
import os
import re
import subprocess
import sys

import pytest

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
VENV_BIN = os.path.dirname(sys.executable)
DOCUMENTS = ["README.md"] + sorted(
    os.path.relpath(path, REPO) for path in glob.glob(os.path.join(REPO, "docs", "*.md"))
)
BLOCK_TIMEOUT = 300  # seconds per block; a TF subprocess takes 5-20 s on a shared 2-core machine
SHELL_LANGUAGES = ("bash", "sh", "shell", "console")
MARKER = re.compile(r"^<!--\s*not run:\s*(?P<reason>.+?)\s*-->$")

PRELUDE = """\
import os
os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")
import tensorflow as tf

_cpu = tf.config.list_physical_devices("CPU")[0]
tf.config.set_logical_device_configuration(_cpu, [tf.config.LogicalDeviceConfiguration()] * 2)


class _MirroredOnLogicalCpus(tf.distribute.MirroredStrategy):
    # The docs say MirroredStrategy() (every local GPU); here: the 2 logical CPUs.
    def __init__(self, devices=None, cross_device_ops=None):
        super().__init__(devices or ["/cpu:0", "/cpu:1"], cross_device_ops)


tf.distribute.MirroredStrategy = _MirroredOnLogicalCpus
del _cpu, _MirroredOnLogicalCpus
"""


@dataclasses.dataclass
class Block:
    document: str
    line: int  # 1-based line of the opening fence
    language: str
    code: str
    skip_reason: str | None

    @property
    def id(self):
        return f"{self.document}:{self.line}:{self.language}"


def extract_blocks(text, document):
    """The fenced code blocks of a markdown text, with the opt-out marker right before each."""
    blocks = []
    lines = text.splitlines()
    index = 0
    while index < len(lines):
        fence = re.match(r"^(```+)\s*([\w+-]*)\s*$", lines[index])
        if not fence:
            index += 1
            continue
        start = index
        ticks, language = fence.group(1), fence.group(2).lower()
        index += 1
        body = []
        while index < len(lines) and lines[index].rstrip() != ticks:
            body.append(lines[index])
            index += 1
        index += 1
        before = lines[start - 1].strip() if start > 0 else ""
        marker = MARKER.match(before)
        blocks.append(
            Block(
                document=document,
                line=start + 1,
                language=language,
                code="\n".join(body) + "\n",
                skip_reason=marker.group("reason") if marker else None,
            )
        )
    return blocks


def _read(document):
    with open(os.path.join(REPO, document), encoding="utf-8") as f:
        return f.read()


def _runnable(block):
    if block.language == "python":
        return True
    return block.language in SHELL_LANGUAGES and "tb-replica" in block.code


ALL_BLOCKS = [
    block
    for document in DOCUMENTS
    for block in extract_blocks(_read(document), document)
    if _runnable(block)
]
_WORKDIRS = {}
_RAN = set()


def _workdir(tmp_path_factory, document):
    if document not in _WORKDIRS:
        name = re.sub(r"\W", "_", document)
        _WORKDIRS[document] = tmp_path_factory.mktemp(name)
    return _WORKDIRS[document]


def _env():
    env = dict(os.environ)
    env["PATH"] = VENV_BIN + os.pathsep + env.get("PATH", "")
    env["TF_CPP_MIN_LOG_LEVEL"] = "2"
    env.pop("TF_CONFIG", None)
    env.pop("TF_USE_LEGACY_KERAS", None)
    return env


def _execute(block, cwd):
    if block.language == "python":
        path = os.path.join(cwd, f"block_{block.line}.py")
        with open(path, "w", encoding="utf-8") as f:
            f.write(PRELUDE + "\n# --- " + block.id + "\n" + block.code)
        command = [sys.executable, path]
    else:
        command = ["bash", "-euo", "pipefail", "-c", block.code]
    try:
        result = subprocess.run(
            command,
            cwd=cwd,
            env=_env(),
            capture_output=True,
            text=True,
            timeout=BLOCK_TIMEOUT,
        )
    except subprocess.TimeoutExpired as error:
        pytest.fail(f"{block.id} did not finish in {BLOCK_TIMEOUT} s:\n{error.stdout}")
    _RAN.add(block.id)
    assert result.returncode == 0, (
        f"{block.id} exited with {result.returncode}\n--- code\n{block.code}"
        f"--- stdout\n{result.stdout[-4000:]}\n--- stderr\n{result.stderr[-6000:]}"
    )
    return result


@pytest.mark.parametrize("block", ALL_BLOCKS, ids=[block.id for block in ALL_BLOCKS])
def test_example_runs(block, tmp_path_factory):
    if block.skip_reason:
        pytest.skip(f"{block.id}: not run: {block.skip_reason}")
    cwd = _workdir(tmp_path_factory, block.document)
    if block.language != "python":
        # A shell block reads what the python blocks before it wrote (also when run alone).
        for earlier in ALL_BLOCKS:
            if (
                earlier.document == block.document
                and earlier.line < block.line
                and earlier.language == "python"
                and not earlier.skip_reason
                and earlier.id not in _RAN
            ):
                _execute(earlier, cwd)
    _execute(block, cwd)


def test_examples_count(capsys):
    """Prints how many blocks the examples test runs and skips (whatever the capture mode)."""
    python = [b for b in ALL_BLOCKS if b.language == "python"]
    shell = [b for b in ALL_BLOCKS if b.language != "python"]
    skipped = [b for b in ALL_BLOCKS if b.skip_reason]
    line = (
        f"docs examples: {len(python)} python blocks and {len(shell)} tb-replica shell blocks "
        f"in {len(DOCUMENTS)} documents; {len(ALL_BLOCKS) - len(skipped)} run, "
        f"{len(skipped)} skipped by a 'not run' marker"
    )
    with capsys.disabled():
        print("\n" + line)
    assert len(python) >= 3 and len(shell) >= 1, line
    for block in skipped:
        assert block.language == "python", f"{block.id}: only python blocks may opt out"


def test_extract_blocks_honours_the_marker_and_languages():
    text = (
        "intro\n\n```python\nx = 1\n```\n\n<!-- not run: needs a TPU -->\n```python\n"
        "tpu()\n```\n\n```bash\ntb-replica report logs\n```\n\n```bash\nbash demo/run.sh\n```\n"
        "```text\ntb-replica report LOGDIR\n```\n"
    )
    blocks = extract_blocks(text, "t.md")
    assert [(b.line, b.language, b.skip_reason) for b in blocks] == [
        (3, "python", None),
        (8, "python", "needs a TPU"),
        (12, "bash", None),
        (16, "bash", None),
        (19, "text", None),
    ]
    assert blocks[1].code == "tpu()\n"
    assert [_runnable(b) for b in blocks] == [True, True, True, False, False]


# --- findings and thresholds: one source (analysis) ---------------------------------------


def _table_rows(text, first_header):
    """Rows (lists of cells) of the markdown table whose first header cell is `first_header`."""
    rows = []
    lines = text.splitlines()
    for index, line in enumerate(lines):
        cells = [c.strip() for c in line.strip().strip("|").split("|")]
        if line.startswith("|") and cells[0] == first_header:
            for row in lines[index + 2 :]:
                if not row.startswith("|"):
                    break
                rows.append([c.strip() for c in row.strip().strip("|").split("|")])
            break
    return rows


def _code_names(cell):
    return re.findall(r"`([A-Za-z_][\w.]*)`", cell)


def _expected_findings_table():
    from tb_replica_plugin.read import judge

    lines = ["| kind | severity | what it means | thresholds |", "|---|---|---|---|"]
    for kind, meta in judge.finding_kinds().items():
        names = ", ".join(f"`{name}`" for name in meta["thresholds"]) or "—"
        lines.append(f"| `{kind}` | {meta['severity']} | {meta['summary']} | {names} |")
    return "\n".join(lines)


@pytest.mark.parametrize("document", ["docs/findings.md", "README.md"])
def test_findings_table_matches_the_rules(document):
    from tb_replica_plugin.read import judge

    kinds = judge.finding_kinds()
    rows = _table_rows(_read(document), "kind")
    hint = f"\nthe table from judge.finding_kinds():\n{_expected_findings_table()}"
    assert rows, f"{document} has no table whose first column is 'kind'" + hint
    documented = {}
    for row in rows:
        names = _code_names(row[0])
        assert len(names) == 1, f"{document}: row without one `kind`: {row}" + hint
        documented[names[0]] = row
    assert set(documented) == set(kinds), (
        f"{document}: kinds only in code {sorted(set(kinds) - set(documented))}, "
        f"only in the doc {sorted(set(documented) - set(kinds))}" + hint
    )
    for kind, meta in kinds.items():
        row = documented[kind]
        assert row[1].split()[0] == meta["severity"], f"{document}: severity of {kind}" + hint
        thresholds = {n.removeprefix("Thresholds.") for n in _code_names(row[-1])}
        assert thresholds == set(meta["thresholds"]), f"{document}: thresholds of {kind}" + hint


def test_every_threshold_is_documented_with_its_default():
    from tb_replica_plugin import analysis
    from tb_replica_plugin.read import judge

    rows = _table_rows(_read("docs/findings.md"), "threshold")
    documented = {}
    for row in rows:
        names = _code_names(row[0])
        assert len(names) == 1, f"threshold row without one `name`: {row}"
        documented[names[0]] = row
    fields = {field.name: field.default for field in dataclasses.fields(analysis.Thresholds)}
    assert set(documented) == set(fields), (
        f"thresholds only in code {sorted(set(fields) - set(documented))}, "
        f"only in docs/findings.md {sorted(set(documented) - set(fields))}"
    )
    used = {name for meta in judge.finding_kinds().values() for name in meta["thresholds"]}
    assert used <= set(fields), f"finding_kinds() names unknown thresholds {used - set(fields)}"
    for name, default in fields.items():
        cell = documented[name][1].strip("` ")
        if default is None:  # a field whose None means "each run's own" (stall_seconds)
            assert cell == "None", f"default of {name}: doc {cell}, code None"
        else:
            assert float(cell) == float(default), f"default of {name}: doc {cell}, code {default}"
        kinds = {k for k in _code_names(documented[name][2])}
        expected = {k for k, meta in judge.finding_kinds().items() if name in meta["thresholds"]}
        assert kinds == expected, f"kinds of threshold {name}: doc {kinds}, code {expected}"


# --- the docs talk about the product, link to files that exist, and name real tests ---------

HISTORY = re.compile(
    r"\b(engineers?|this morning|yesterday|work items?|before/after|sessions?)\b"
    r"|\b20\d\d-\d\d-\d\d\b",
    re.IGNORECASE,
)


SOURCE_LINES = ("- Measured ", "- Transcribed from the run of ")


@pytest.mark.parametrize("document", DOCUMENTS)
def test_no_history_in_the_docs(document):
    offending = []
    in_figures = False  # inside a block rendered by benchmarks.tables
    for number, line in enumerate(_read(document).splitlines(), 1):
        if "<!-- figures:" in line or "<!-- /figures:" in line:
            in_figures = "<!-- /figures:" not in line
        if in_figures and line.startswith(SOURCE_LINES):
            continue  # a benchmark table's run: date, command, machine (benchmarks.tables)
        if HISTORY.search(line):
            offending.append(f"{document}:{number}: {line}")
    assert not offending, "history belongs in git:\n" + "\n".join(offending)


@pytest.mark.parametrize("document", DOCUMENTS)
def test_relative_links_resolve(document):
    base = os.path.dirname(os.path.join(REPO, document))
    missing = []
    text = _read(document)
    targets = re.findall(r"\]\(([^)#\s]+)(?:#[^)]*)?\)", text) + re.findall(r'src="([^"#]+)"', text)
    for target in targets:
        if "://" in target or target.startswith("mailto:"):
            continue
        if not os.path.exists(os.path.join(base, target)):
            missing.append(target)
    assert not missing, f"{document} links to missing files: {missing}"


def test_compatibility_table_names_existing_tests():
    sources = "".join(_read(os.path.relpath(p, REPO)) for p in glob.glob(f"{REPO}/tests/*.py"))
    defined = set(re.findall(r"^def (test_\w+)", sources, re.MULTILINE))
    named = set(re.findall(r"`(?:[\w/]+\.py::)?(test_\w+)", _read("docs/compatibility.md")))
    assert named, "docs/compatibility.md names no test"
    assert named <= defined, f"docs/compatibility.md names missing tests: {named - defined}"


def test_http_api_documents_every_route_and_argument():
    """http_api.md has one `GET` heading per route of the plugin (and no other), and the heading
    of each family route names every argument its present module parses."""
    from tb_replica_plugin import plugin, registry

    class Context:
        data_provider = None

    routes = set(plugin.ReplicasPlugin(Context()).get_plugin_apps())
    headings = re.findall(r"^## `GET ([^`]+)`", _read("tb_replica_plugin/http_api.md"), re.M)
    documented = {re.sub(r"\?.*$|\[.*$", "", h).replace("<file>", "*"): h for h in headings}
    assert set(documented) == routes, (
        f"routes without a heading: {sorted(routes - set(documented))}; "
        f"headings without a route: {sorted(set(documented) - routes)}"
    )
    undocumented = [
        f"{family.route} {name}"
        for family in registry.families()
        if family.route
        for name in family.present.args
        if f"{name}=" not in documented[family.route]
    ]
    assert not undocumented, f"arguments missing from http_api.md headings: {undocumented}"


def _python_range(text, where):
    """`(first, last)` minor versions of the one "Python 3.X–3.Y" in `text`."""
    found = set(re.findall(r"Python\s+3\.(\d+)[–-]3\.(\d+)", text))
    assert len(found) == 1, f"{where}: expected one 'Python 3.X–3.Y', found {sorted(found)}"
    first, last = found.pop()
    return int(first), int(last)


def test_the_python_window_agrees():
    """README, docs/compatibility.md, setup.py's classifiers, .ci/setup.sh's check and the Pythons
    .ci/window.py tests on name the same Python window (its ends each tested in .ci/window.py)."""
    import importlib.util

    readme = _python_range(_read("README.md"), "README.md")
    assert _python_range(_read("docs/compatibility.md"), "docs/compatibility.md") == readme
    first, last = readme
    minors = list(range(first, last + 1))
    classifiers = re.findall(r'"Programming Language :: Python :: 3\.(\d+)"', _read("setup.py"))
    assert [int(m) for m in classifiers] == minors, f"setup.py's classifiers: {classifiers}"
    assert f'python_requires=">=3.{first}"' in _read("setup.py")
    accepted = re.search(r"^  (3\.\d+(?: \| 3\.\d+)*)\) ;;$", _read(".ci/setup.sh"), re.M)
    assert accepted, ".ci/setup.sh has no `case` of accepted Python versions"
    assert accepted.group(1) == " | ".join(f"3.{m}" for m in minors), accepted.group(1)
    spec = importlib.util.spec_from_file_location("window", os.path.join(REPO, ".ci", "window.py"))
    window = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(window)
    pythons = {int(e.python.split(".")[1]) for e in window.ENTRIES if e.ci}
    assert min(pythons) == first and max(pythons) == last, (
        f".ci/run tests Pythons 3.x for x in {pythons}"
    )
    assert {int(e.python.split(".")[1]) for e in window.ENTRIES} == set(minors)


def test_the_numpy_floor_agrees():
    """README and docs/compatibility.md name setup.py's numpy floor, which a .ci/window.py entry
    installs."""
    floor = re.search(r'"numpy>=([\d.]+)"', _read("setup.py")).group(1)
    for document in ("README.md", "docs/compatibility.md"):
        named = re.findall(r"numpy (\d[\d.]*)–", _read(document))
        assert named == [floor], f"{document} names numpy {named}, setup.py's floor is {floor}"
    assert f'"numpy=={floor}"' in _read(".ci/window.py")
