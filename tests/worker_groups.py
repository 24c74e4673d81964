"""Which tests share a pytest-xdist worker (`pytest -n 2`, README): those that fetch one of
the families' session-scoped package exports (tests/conftest.py), so each export is made once
in the run, not once per worker; every other test with the rest of its file, so its module
fixtures are made once too.

Tests are first put in units, a file's tests or, for a file that fetches a case's fixtures
by its parameter (`request.getfixturevalue`), one case's tests; units that use one of the
shared exports are then joined. The exports of tiny-sora itself (`exported_package`,
`coreml_package`: under a minute each) are used by most files and are left out, or every
test would land on one worker."""

from __future__ import annotations

import pytest

SHARED_EXPORTS = frozenset({
    "wan_packages", "wan22_package", "cog_packages", "ltx_packages", "wan_iphone_package",
    "wan22_iphone_package", "cog_iphone_package", "ltx_plain_iphone_package",
    "ltx_iphone_package"})


def fetched_fixtures(item: pytest.Item) -> tuple[str | None, set[str]]:
    """(the case the test's module fetches fixtures for, or None; the shared exports the
    test uses, named or fetched by its case)."""
    names = set(item.fixturenames) & SHARED_EXPORTS
    fetched = getattr(item.module, "fixtures_fetched_by_case", None)
    params = getattr(getattr(item, "callspec", None), "params", {})
    if fetched is not None:
        for value in params.values():
            found = fetched(item.originalname, value) if isinstance(value, str) else None
            if found is not None:
                return value, names | (set(found) & SHARED_EXPORTS)
    return None, names


def _root(parent: dict, unit: str) -> str:
    while parent[unit] != unit:
        parent[unit] = parent[parent[unit]]
        unit = parent[unit]
    return unit


def assign_worker_groups(items: list[pytest.Item]) -> dict[str, str]:
    """Mark each item `xdist_group(<group>)`; returns {nodeid: group}."""
    parent: dict[str, str] = {}
    owner: dict[str, str] = {}   # shared export -> the first unit that used it
    units = {}
    for item in items:
        case, exports = fetched_fixtures(item)
        unit = item.path.name + (f"[{case}]" if case else "")
        units[item.nodeid] = unit
        parent.setdefault(unit, unit)
        for name in sorted(exports):
            first = owner.setdefault(name, unit)
            a, b = _root(parent, first), _root(parent, unit)
            if a != b:
                parent[max(a, b)] = min(a, b)
    groups = {}
    for item in items:
        group = _root(parent, units[item.nodeid])
        item.add_marker(pytest.mark.xdist_group(group))
        groups[item.nodeid] = group
    return groups
