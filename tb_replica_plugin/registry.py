"""The one registry of stat families: which families exist, in which order, and what they need.

A family is one package under `tb_replica_plugin/families/` (or anywhere importable) whose
`__init__` defines `FAMILY = Family(...)`: a typed descriptor (`core.family`) that names every
part of the family (its reader and merge, its rules, its presenter, its write side). Adding a
family is: its package, one line in `_registered` below, one tab section in
`frontend/src/sections.js`.

Order: the registry is in dependency order (a family comes after every family it `needs` or
`uses`) and is also the order of the tab's routes and of `/runs` "families". The reader reads
families in this order, so a family can use the series of the families it needs.

Imports no TensorFlow: a descriptor names its write side by a function that imports it
(`Family.write_side`), called by the probe only; the read side (numpy) is imported with the
descriptors, on first use.
"""

import contextlib
import fnmatch

# The descriptor types live on the ground floor (`core.family`); named here too.
from tb_replica_plugin.core.family import Family, Presenter, Rules  # noqa: F401


def _registered():
    """Every built-in family's descriptor, one line each, in dependency order."""
    from tb_replica_plugin.families import (
        examples,
        gradients,
        inputs,
        rng,
        status,
        step_time,
        variables,
        watch,
    )

    return (
        inputs.FAMILY,
        step_time.FAMILY,
        gradients.FAMILY,
        rng.FAMILY,
        examples.FAMILY,
        variables.FAMILY,
        watch.FAMILY,
        status.FAMILY,
    )


_extra = ()  # families registered by `registered`, after the built-in ones
_loaded = None  # the tuple `families()` returns, built on first use
_tag_family = {}  # tag -> family, for `family_of_tag` (emptied when the registry changes)


@contextlib.contextmanager
def registered(*descriptors):
    """Registers `descriptors` after the built-in families for the duration of the block.

    For tests (tests/toy_family/) and for a family that lives outside this package.

    Args:
      *descriptors: `Family` descriptors, in dependency order.

    Raises:
      ValueError: (on entry) if a descriptor's `needs` or `uses` is not registered before it.

    Example:
      >>> with registry.registered(toy_family.FAMILY):
      ...     [f.name for f in registry.families()][-1]
      'toy'
    """
    global _extra, _loaded
    previous = _extra
    _extra, _loaded = (*previous, *descriptors), None
    try:
        families()
        yield
    finally:
        _extra, _loaded = previous, None


def families():
    """Every family's descriptor, in registry (dependency) order; loaded once and cached.

    Returns:
      A tuple of `Family`.

    Raises:
      ValueError: if two families share a name or a family needs or uses one that is missing
        or comes later in the registry.
    """
    global _loaded
    loaded = _loaded
    if loaded is None:
        loaded = (*_registered(), *_extra)
        check_order(loaded)
        _tag_family.clear()
        _loaded = loaded  # request threads may race here: each builds an equal tuple
    return loaded


def check_order(descriptors):
    """Checks that names are unique and that every family's `needs` and `uses` come before it.

    Args:
      descriptors: `Family` descriptors in registry order.

    Raises:
      ValueError: naming the first duplicate, or the first family whose need is missing or
        registered after it.
    """
    seen = set()
    for descriptor in descriptors:
        if descriptor.name in seen:
            raise ValueError(f"two families are called {descriptor.name!r}")
        for need in (*descriptor.needs, *descriptor.uses):
            if need not in seen:
                raise ValueError(
                    f"family {descriptor.name!r} needs {need!r}, which is not registered before it"
                )
        seen.add(descriptor.name)


def family(name):
    """The descriptor of the family called `name`.

    Raises:
      KeyError: if no registered family has that name.
    """
    for descriptor in families():
        if descriptor.name == name:
            return descriptor
    raise KeyError(name)


def live_names():
    """The names of the registered families with `live` set (a frozenset)."""
    return frozenset(f.name for f in families() if f.live)


def family_of_tag(tag):
    """The registered family that writes `tag` (exact tag, else a tag pattern), or None.

    Remembered per tag until the registry changes (a job's data version asks it per tag and
    worker).
    """
    loaded = families()
    if tag not in _tag_family:
        found = next((d for d in loaded if tag in d.tags), None)
        if found is None:
            patterns = ((d, p) for d in loaded for p in d.tags if "*" in p)
            found = next((d for d, p in patterns if fnmatch.fnmatchcase(tag, p)), None)
        _tag_family[tag] = found
    return _tag_family[tag]


def tag_kinds():
    """`{tag: kind}` of every registered family's schema."""
    kinds = {}
    for descriptor in families():
        kinds.update(descriptor.tags)
    return kinds


def kind_version(kind):
    """The schema version written for `kind` (1 unless its family's `versions` says newer)."""
    for descriptor in families():
        if kind in descriptor.versions:
            return descriptor.versions[kind]
    return 1


def tag_kind(tag):
    """The kind of a written tag: its family's exact tag, else the first matching tag pattern.

    Args:
      tag: a tag as written, e.g. "inputs/shapes" or "watch/logits/stats".

    Returns:
      The kind (str), or None when no registered family writes such a tag.
    """
    kinds = tag_kinds()
    if tag in kinds:
        return kinds[tag]
    for pattern, kind in kinds.items():
        if "*" in pattern and fnmatch.fnmatchcase(tag, pattern):
            return kind
    return None
