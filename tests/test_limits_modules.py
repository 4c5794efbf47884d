"""Every named limit lives in one limits module (metaq/limits.py for what every layer shares, a ``limits.py`` of its
package for a feature's), with the reason for its value above it; ``metaq.limits.modules`` finds them all, and the
docs' limits page names only limits that one of them defines.

A unit test: it reads the modules' source and imports them, and opens no socket.
"""

import ast
import importlib
import pathlib
import re

from metaq import limits

ROOT = pathlib.Path(__file__).resolve().parent.parent


def module_path(name):
    return ROOT.joinpath(*name.split(".")).with_suffix(".py")


def constants(tree):
    """``[(line, name)]`` of the public names a module's top level assigns."""
    found = []
    for node in tree.body:
        if isinstance(node, ast.Assign):
            found += [(node.lineno, t.id) for t in node.targets if isinstance(t, ast.Name) and not t.id.startswith("_")]
    return found


def defined():
    """``{name: [limits modules assigning it]}``."""
    found = {}
    for name in limits.modules():
        for _line, constant in constants(ast.parse(module_path(name).read_text(encoding="utf-8"))):
            found.setdefault(constant, []).append(name)
    return found


def test_modules_are_every_limits_py_of_the_package_and_each_imports():
    on_disk = sorted(".".join(p.relative_to(ROOT).with_suffix("").parts) for p in (ROOT / "metaq").rglob("limits.py"))
    assert limits.modules() == on_disk
    assert {"metaq.limits", "metaq.mqtt.limits", "metaq.server.http.limits"} <= set(on_disk)
    for name in on_disk:
        assert importlib.import_module(name).__doc__, name


def test_each_limit_is_defined_in_one_module():
    assert {name: where for name, where in defined().items() if len(where) > 1} == {}


def unexplained(path, base=ROOT):
    """Public constants of the limits module at ``path`` with no ``#:`` comment above them (directly, or above the
    run of constants they close, written with no blank line between)."""
    lines = path.read_text(encoding="utf-8").split("\n")
    found = []
    for line, name in constants(ast.parse("\n".join(lines))):
        row = line - 2  # the line above, 0-based
        while row >= 0 and lines[row].strip() and not lines[row].lstrip().startswith("#"):
            row -= 1  # a constant of the same run, or the rest of a statement
        if row < 0 or not lines[row].lstrip().startswith("#:"):
            found.append("%s:%d %s" % (path.relative_to(base), line, name))
    return found


def test_each_limit_keeps_its_reason():
    assert [u for name in limits.modules() for u in unexplained(module_path(name))] == []


def test_the_reason_check_finds_a_bare_constant(tmp_path):
    path = tmp_path / "limits.py"
    path.write_text("#: Why.\nA = 1\nB = 2\n\nC = 3\n#: Why both.\nD = 4\nE = (5 +\n     6)\nF = 7\n")
    assert unexplained(path, tmp_path) == ["limits.py:5 C"]


#: A capital name in backticks: a limit (``MAX_TURN_MS``), or with its pair folded in
#: (``MAX_PENDING_NOTIFY_BYTES(_TOTAL)``).
NAMED = re.compile(r"`([A-Z][A-Z0-9]*(?:_[A-Z0-9]+)+)(?:\(_[A-Z0-9_]+\))?`")


def page_names(text):
    """The capital names in the last column ("governed by") of the limits page's tables."""
    names = set()
    for line in text.splitlines():
        cells = line.split("|")
        if line.startswith("|") and len(cells) >= 4 and not set(cells[-2].strip()) <= set("-"):
            names.update(NAMED.findall(cells[-2]))
    return names


def test_the_limits_page_names_only_limits_that_exist():
    page = (ROOT / "docs" / "limits.md").read_text(encoding="utf-8")
    names = page_names(page)
    assert len(names) > 50  # the page's tables were read
    assert sorted(names - set(defined())) == []


def test_the_page_reader_takes_the_governed_by_column():
    table = ("| attack | does | governed by |\n|---|---|---|\n"
             "| `NOT_THIS` floods | `SYSTEM_BUSY` | `MAX_TURN_MS`, `limits.max_body_bytes`, "
             "`MAX_PENDING_NOTIFY_BYTES(_TOTAL)` |\n")
    assert page_names(table) == {"MAX_TURN_MS", "MAX_PENDING_NOTIFY_BYTES"}
