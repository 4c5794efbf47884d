"""DESIGN §2: imports go one way. Walk every module's imports with ast and fail on a forbidden one."""

import ast
import pathlib

import pytest

ROOT = pathlib.Path(__file__).resolve().parent.parent / "metaq"

IO_MODULES = {"socket", "socketserver", "select", "selectors", "asyncio", "ssl", "gevent", "kazoo", "threading", "_thread", "signal",
              "multiprocessing", "subprocess", "concurrent"}

# layer -> (metaq packages it may import, other top-level modules it must not import)
RULES = {
    "errors": ({"metaq.errors"}, IO_MODULES | {"logging", "time"}),
    "limits": ({"metaq.errors", "metaq.limits"}, IO_MODULES | {"logging", "time"}),
    "protocol": ({"metaq.errors", "metaq.limits", "metaq.protocol"}, IO_MODULES | {"logging", "time"}),
    "store": ({"metaq.errors", "metaq.limits", "metaq.protocol", "metaq.store"}, IO_MODULES | {"time", "datetime"}),
    "tx": ({"metaq.errors", "metaq.limits", "metaq.protocol", "metaq.store", "metaq.tx"}, IO_MODULES | {"time", "datetime"}),
    "server": ({"metaq", "metaq.errors", "metaq.limits", "metaq.protocol", "metaq.store", "metaq.tx",
                "metaq.server"}, set()),
    # The client talks to ZooKeeper through kazoo (its threading handler), never through gevent.
    "client": ({"metaq", "metaq.errors", "metaq.limits", "metaq.protocol", "metaq.client"}, {"gevent"}),
    "spark": ({"metaq", "metaq.errors", "metaq.limits", "metaq.protocol", "metaq.client", "metaq.spark"},
              {"gevent"}),
}


def layer_of(path, root=ROOT):
    rel = path.relative_to(root)
    if len(rel.parts) == 1:
        return {"errors.py": "errors", "limits.py": "limits"}.get(rel.parts[0])
    return rel.parts[0]


def imported_names(tree):
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            for alias in node.names:
                yield node.lineno, alias.name
        elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
            yield node.lineno, node.module
            if node.module == "metaq":
                for alias in node.names:
                    yield node.lineno, "metaq." + alias.name


#: The optional C helper and its loader (stdlib only, no metaq imports): any layer may use them.
LEAVES = {"metaq._speedups", "metaq.speedups"}


def allowed(name, metaq_ok):
    return any(name == ok or name.startswith(ok + ".") for ok in metaq_ok) or name == "metaq" or name in LEAVES


def violations(path, root=ROOT):
    layer = layer_of(path, root)
    if layer not in RULES:
        return []
    metaq_ok, banned = RULES[layer]
    tree = ast.parse(path.read_text(), str(path))
    found = []
    for lineno, name in imported_names(tree):
        top = name.split(".")[0]
        if top == "metaq":
            if not allowed(name, metaq_ok):
                found.append("%s:%d imports %s (layer %s)" % (path.name, lineno, name, layer))
        elif top in banned:
            found.append("%s:%d imports %s (layer %s)" % (path.name, lineno, name, layer))
    return found


def monkey_patches(path):
    return "monkey.patch_all" in path.read_text() or "monkey.patch_" in path.read_text()


MODULES = sorted(ROOT.rglob("*.py"))


@pytest.mark.parametrize("path", MODULES, ids=lambda p: str(p.relative_to(ROOT)))
def test_imports_respect_layers(path):
    assert violations(path) == []


def test_only_the_server_entry_point_monkey_patches():
    patchers = [str(p.relative_to(ROOT)) for p in MODULES if monkey_patches(p)]
    assert patchers == ["server/__main__.py"]


def test_checker_catches_a_forbidden_import(tmp_path):
    fake_root = tmp_path / "metaq"
    (fake_root / "store").mkdir(parents=True)
    bad = fake_root / "store" / "bad.py"
    bad.write_text("import socket\nfrom metaq.server import broker\nimport time\n")
    assert len(violations(bad, fake_root)) == 3
