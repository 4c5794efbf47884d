"""The native layer (metaq/native/__init__.py): each compiled module is its Python source built with Cython, found
as its extension when built and current, and the source itself otherwise or under METAQ_PURE_PYTHON=1."""

import importlib
import os
import pathlib
import re
import subprocess
import sys
import time

import pytest

from metaq import native

ROOT = pathlib.Path(__file__).resolve().parent.parent


@pytest.mark.parametrize("name", native.COMPILED)
def test_each_compiled_module_has_its_source(name):
    assert pathlib.Path(native.source_path(name)).is_file()


@pytest.mark.parametrize("name", native.COMPILED)
def test_a_built_module_runs_compiled_unless_pure_python_is_asked(name):
    built = native.extension_path(name)
    if not os.path.exists(built):
        pytest.skip("not built here (no Cython or compiler): the source runs")
    module = importlib.import_module(name)
    if native.pure():
        assert module.__file__ == native.source_path(name)
    else:
        assert module.__file__ == built and name in native.running()


@pytest.mark.parametrize("name", native.COMPILED)
def test_each_class_a_declaration_file_names_is_a_c_struct_where_its_module_runs_compiled(name):
    """A ``cdef class`` of the module's ``.pxd`` (typed fields, C-called methods: the publisher's turn's burst writer,
    ids, positions, counters and subscriber paths) is an extension type where the module runs compiled, a plain class
    where its source runs: a declaration that stopped applying is seen here, not only in the turn's cost."""
    pxd = pathlib.Path(native.source_path(name)[:-3] + ".pxd")
    if not pxd.is_file():
        pytest.skip("no declarations")
    module = importlib.import_module(name)
    compiled = name in native.running()
    for cls in re.findall(r"^cdef class (\w+)", pxd.read_text(), re.M):
        heap = bool(getattr(module, cls).__flags__ & (1 << 9))  # Py_TPFLAGS_HEAPTYPE: a class made at run time
        assert heap != compiled, (name, cls)


def test_pure_python_runs_every_source():
    code = "import importlib, metaq.native as n; print(all(importlib.import_module(m).__file__.endswith('.py') " \
           "for m in n.COMPILED), n.running())"
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True, cwd=ROOT,
                         env=dict(os.environ, METAQ_PURE_PYTHON="1")).stdout.split()
    assert out == ["True", "[]"]


def _package(tmp_path, built_age_s):
    """A fake metaq tree with one module and a stand-in for its extension, ``built_age_s`` older than the source."""
    (tmp_path / "pkg").mkdir()
    source = tmp_path / "pkg" / "mod.py"
    source.write_text("X = 1\n")
    built = pathlib.Path(native.extension_path("metaq.pkg.mod", str(tmp_path)))
    built.parent.mkdir(parents=True)
    built.write_bytes(b"")
    now = time.time()
    os.utime(source, (now, now))
    os.utime(built, (now - built_age_s, now - built_age_s))
    return native.CompiledFinder(["metaq.pkg.mod"], str(tmp_path))


def test_a_current_extension_is_found(tmp_path):
    finder = _package(tmp_path, -5)
    spec = finder.find_spec("metaq.pkg.mod")
    assert spec.origin == native.extension_path("metaq.pkg.mod", str(tmp_path))
    assert finder.loaded() == ["metaq.pkg.mod"]
    assert finder.find_spec("metaq.pkg.other") is None


def test_an_extension_older_than_its_source_is_not_loaded_and_says_so(tmp_path):
    finder = _package(tmp_path, 5)
    with pytest.warns(RuntimeWarning, match="rebuild"):
        assert finder.find_spec("metaq.pkg.mod") is None
    assert finder.loaded() == []


def _two_modules(tmp_path):
    """A fake metaq tree: ``metaq.pkg.b`` cimports ``metaq.pkg.a`` (its ``.pxd`` says so), both built after their
    files; returns ``(finder, path of a file by name)``."""
    (tmp_path / "pkg").mkdir(parents=True)
    files = {"a.py": "X = 1\n", "a.pxd": "cdef class A:\n    pass\n", "b.py": "Y = 1\n",
             "b.pxd": "cimport cython\nfrom metaq.pkg.a cimport A\n"}
    then = time.time() - 60
    for file, text in files.items():
        (tmp_path / "pkg" / file).write_text(text)
        os.utime(tmp_path / "pkg" / file, (then, then))
    for name in ("metaq.pkg.a", "metaq.pkg.b"):
        built = pathlib.Path(native.extension_path(name, str(tmp_path)))
        built.parent.mkdir(parents=True, exist_ok=True)
        built.write_bytes(b"")
        os.utime(built, (then + 10, then + 10))
    return native.CompiledFinder(["metaq.pkg.a", "metaq.pkg.b"], str(tmp_path)), lambda f: tmp_path / "pkg" / f


def test_a_module_runs_compiled_only_while_what_it_cimports_does_and_is_older_than_it(tmp_path):
    """A module's extension built against another's declarations: current, both run compiled; those declarations
    edited since (not rebuilt) or the other running as Python (its source edited), it runs as Python too, and the
    warning says why (else its import would fail on the changed class)."""
    finder, path = _two_modules(tmp_path)
    assert finder.find_spec("metaq.pkg.b") is not None and finder.find_spec("metaq.pkg.a") is not None
    assert finder.loaded() == ["metaq.pkg.a", "metaq.pkg.b"]
    finder, path = _two_modules(tmp_path / "declared")
    os.utime(path("a.pxd"))
    with pytest.warns(RuntimeWarning, match=r"cimports metaq\.pkg\.a, .*older than .*a\.pxd"):
        assert finder.find_spec("metaq.pkg.b") is None
    assert finder.loaded() == []
    finder, path = _two_modules(tmp_path / "source")
    os.utime(path("a.py"))
    with pytest.warns(RuntimeWarning, match=r"cimports metaq\.pkg\.a, .*older than .*a\.py"):
        assert finder.find_spec("metaq.pkg.b") is None
    with pytest.warns(RuntimeWarning, match=r"older than .*a\.py"):
        assert finder.find_spec("metaq.pkg.a") is None
    assert finder.loaded() == []


def test_a_module_never_built_runs_its_source(tmp_path):
    assert native.CompiledFinder(["metaq.pkg.mod"], str(tmp_path)).find_spec("metaq.pkg.mod") is None


def _docstring_names():
    return set(re.findall(r"``([\w.]+)``", native.__doc__))


def test_no_c_file_at_the_package_root():
    assert sorted(p.name for p in (ROOT / "metaq").iterdir() if p.suffix in (".c", ".h")) == []


def test_the_docstring_maps_every_native_file_and_compiled_module():
    folder = ROOT / "metaq" / "native"
    files = {p.name for p in folder.iterdir() if p.suffix in (".c", ".h")}
    named = _docstring_names()
    assert files - named == set(), "C files the docstring of metaq/native/__init__.py does not map"
    assert {n for n in named if n.endswith((".c", ".h"))} - files == set(), "files mapped that are not there"
    assert {n.split(".", 1)[1] for n in native.COMPILED} - named == set(), "compiled modules the docstring omits"
