"""The package's layers (docs/architecture.md, "Layers"), read from every import of its source.

Pure Python: every module is parsed with `ast` (imports inside functions included, none is
run), each is given its floor, and an import may only go down or stay on its floor. `keras/`
imports no family (it reaches them through the registry and their recorders' fit hooks), a
family imports only itself, the ground floor and the families it declares in `uses` or `needs`,
and no two modules import each other, directly or around a circle.
"""

import ast
import fnmatch
import os

import tb_replica_plugin

PACKAGE = os.path.dirname(tb_replica_plugin.__file__)

# Lowest first. A module takes the floor of the first pattern it matches.
FLOORS = (
    ("ground floor", ("core", "core.*", "analysis", "requirements")),
    ("families", ("families", "families.*")),
    ("registry", ("registry", "metadata")),
    ("read: files and judging", ("read", "read.*")),
    ("read: a run", ("reader",)),
    ("read: a run of a group read", ("member_read",)),
    ("read: a job's first read shared", ("shared_read",)),
    ("read: a run or job read on", ("group",)),
    ("read: the routes' store", ("store",)),
    ("read: entry points", ("report", "plugin")),
    ("write: the probe's engine", ("write", "write.*")),
    ("write: ReplicaProbe", ("probe",)),
    ("write: Keras and inspect_dataset", ("keras", "keras.*", "preflight")),
    ("top", ("cli", "")),
)


def _modules():
    """`{dotted name relative to the package ("" for it): (path, is_package)}`."""
    found = {}
    for directory, _, files in os.walk(PACKAGE):
        for name in files:
            if not name.endswith(".py"):
                continue
            path = os.path.join(directory, name)
            parts = os.path.relpath(path, PACKAGE)[: -len(".py")].split(os.sep)
            is_package = parts[-1] == "__init__"
            if is_package:
                parts = parts[:-1]
            found[".".join(parts)] = (path, is_package)
    return found


def _imported(node, module, is_package, modules):
    """The package's modules an `Import` or `ImportFrom` node names (relative to the package)."""
    prefix = "tb_replica_plugin"
    if isinstance(node, ast.Import):
        names = [alias.name for alias in node.names]
    else:
        if node.level:
            base = (["tb_replica_plugin"] + module.split(".")) if module else [prefix]
            base = base if is_package else base[:-1]
            base = base[: len(base) - node.level + 1]
            source = ".".join(base + ([node.module] if node.module else []))
        else:
            source = node.module or ""
        names = [f"{source}.{alias.name}" for alias in node.names] + [source]
        names = [n for n in names[:-1] if _relative(n) in modules] or [source]
    found = set()
    for name in names:
        if name != prefix and not name.startswith(prefix + "."):
            continue
        relative = _relative(name)
        while relative not in modules and "." in relative:
            relative = relative.rsplit(".", 1)[0]
        if relative in modules:
            found.add(relative)
        elif relative != "" and "." not in relative:
            found.add("")
    return found


def _relative(name):
    return name.removeprefix("tb_replica_plugin").removeprefix(".")


def import_graph():
    """`{module: {modules it imports}}` over the package, every import statement counted."""
    modules = _modules()
    graph = {}
    for module, (path, is_package) in modules.items():
        with open(path, encoding="utf-8") as source:
            tree = ast.parse(source.read(), path)
        edges = set()
        for node in ast.walk(tree):
            if isinstance(node, (ast.Import, ast.ImportFrom)):
                edges |= _imported(node, module, is_package, modules)
        edges.discard(module)
        graph[module] = edges
    return graph


def floor_of(module):
    """The index in `FLOORS` of `module`'s floor."""
    for index, (_, patterns) in enumerate(FLOORS):
        if any(fnmatch.fnmatchcase(module, pattern) for pattern in patterns):
            return index
    raise AssertionError(f"module {module!r} has no floor: add it to FLOORS and the docs")


def cycles(graph):
    """The strongly connected components of more than one module (Tarjan), each sorted."""
    index, low, stack, on_stack, found = {}, {}, [], set(), []

    def visit(start):
        work = [(start, iter(sorted(graph[start])))]
        index[start] = low[start] = len(index)
        stack.append(start)
        on_stack.add(start)
        while work:
            node, edges = work[-1]
            for target in edges:
                if target not in index:
                    index[target] = low[target] = len(index)
                    stack.append(target)
                    on_stack.add(target)
                    work.append((target, iter(sorted(graph[target]))))
                    break
                if target in on_stack:
                    low[node] = min(low[node], index[target])
            else:
                work.pop()
                if work:
                    low[work[-1][0]] = min(low[work[-1][0]], low[node])
                if low[node] == index[node]:
                    component = []
                    while True:
                        member = stack.pop()
                        on_stack.discard(member)
                        component.append(member)
                        if member == node:
                            break
                    if len(component) > 1:
                        found.append(sorted(component))

    for module in sorted(graph):
        if module not in index:
            visit(module)
    return found


def _name(module):
    return f"tb_replica_plugin.{module}" if module else "tb_replica_plugin"


def test_every_module_has_a_floor_and_imports_only_below_or_beside_it():
    graph = import_graph()
    assert {"core.family", "registry", "reader", "write.probe", "keras.callback"} <= set(graph)
    upward = [
        f"{_name(module)} ({FLOORS[floor_of(module)][0]}) imports {_name(target)} "
        f"({FLOORS[floor_of(target)][0]})"
        for module, targets in sorted(graph.items())
        for target in sorted(targets)
        if floor_of(target) > floor_of(module)
    ]
    assert upward == []


def test_keras_imports_no_family():
    graph = import_graph()
    keras = {m: t for m, t in graph.items() if m == "keras" or m.startswith("keras.")}
    assert "keras.callback" in keras
    families = {
        f"{_name(m)} imports {_name(t)}"
        for m, targets in keras.items()
        for t in targets
        if t.startswith("families")
    }
    assert families == set()


def test_a_family_imports_only_itself_the_ground_floor_and_what_it_declares():
    from tb_replica_plugin import registry

    declared = {f.name: {f.name, *f.needs, *f.uses} for f in registry.families()}
    graph = import_graph()
    assert "families.inputs.read" in graph
    wrong = []
    for module, targets in sorted(graph.items()):
        parts = module.split(".")
        if parts[0] != "families" or len(parts) < 2:
            continue
        for target in targets:
            other = target.split(".")
            if other[0] == "families" and len(other) > 1 and other[1] not in declared[parts[1]]:
                wrong.append(f"{_name(module)} imports {_name(target)}")
    assert wrong == []


def test_no_module_cycle():
    found = cycles(import_graph())
    assert found == [], "import cycles: " + "; ".join(" <-> ".join(c) for c in found)


def test_the_checks_see_an_upward_import_and_a_cycle():
    """The test's own parts find what they are for (a graph made up here)."""
    graph = {"core.a": {"registry"}, "registry": {"core.a"}, "reader": set()}
    assert cycles(graph) == [["core.a", "registry"]]
    assert floor_of("core.a") < floor_of("registry") < floor_of("reader")
    modules = _modules()
    node = ast.parse("from tb_replica_plugin.read import event_files, judge").body[0]
    assert _imported(node, "group", False, modules) == {"read.event_files", "read.judge"}
    node = ast.parse("from . import schema").body[0]
    assert _imported(node, "families.inputs.read", False, modules) == {"families.inputs.schema"}
    node = ast.parse("import tb_replica_plugin.core.nest").body[0]
    assert _imported(node, "probe", False, modules) == {"core.nest"}
