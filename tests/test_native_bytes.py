"""The hand-written C is for bytes only: buffers and plain values in, plain values out. No C file of the package
reads or writes another object's attributes by name or calls back into Python (issue 68 point 2).

Each ``*.c`` and ``*.h`` under ``metaq/`` is read with its comments and string literals blanked, and every use of a
forbidden name is a failure naming the file, the line, the function and the name:

* attributes by name: ``PyObject_GetAttr*``, ``SetAttr*``, ``HasAttr*``, ``DelAttr*``, ``GetOptionalAttr*``,
  ``PyObject_GenericGetAttr``/``SetAttr``/``GetDict``/``SetDict`` (another object's ``__dict__`` filled by hand),
  CPython's private ``_PyObject_*Attr*``/``_PyObject_GetDictPtr``/``_PyType_Lookup``, ``PyMember_GetOne``/``SetOne``,
  the type slots ``tp_getattr(o)``/``tp_setattr(o)``/``tp_descr_get``/``tp_descr_set`` reached through an object, and
  interned names (``PyUnicode_InternFromString``/``InternInPlace``, ``_Py_IDENTIFIER``, ``_Py_ID``): a bytes
  function has no name to intern but an attribute's;
* calls back into Python: ``PyObject_Call*``, ``PyObject_Vectorcall*``, ``PyVectorcall_*``, ``PyCFunction_Call``,
  ``_PyObject_FastCall*``, ``PyEval_Call*``/``Eval*``/``Get*``, ``PyRun_*``, ``Py_CompileString*``, a type's
  ``tp_call`` reached through an object, ``PyObject_Dir``;
* Python modules imported from C: ``PyImport_*``, ``PyCapsule_Import``, ``PySys_GetObject``.

Allowed: building results (tuples, a tuple subclass made by tuple's ``tp_new``, lists, dicts, bytes, str, ints),
reading the plain values given (buffers, ints, str, sequences, dict and set lookups), raising exceptions, a type's
name in an error message, the buffer protocol. Those reach Python code only through a value that is not plain,
which the functions' contracts exclude.
"""

import os
import re

import pytest

ROOT = os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "metaq")

_FORBIDDEN = re.compile(
    r"\b(?:"
    r"PyObject_(?:Get|Set|Has|Del|GetOptional)Attr\w*"
    r"|PyObject_Generic(?:Get|Set)(?:Attr|Dict)"
    r"|_PyObject_\w*Attr\w*|_PyObject_GetDictPtr|_PyType_Lookup\w*|PyType_Lookup\w*"
    r"|PyMember_(?:GetOne|SetOne)"
    r"|PyUnicode_Intern\w*|_Py_IDENTIFIER|_Py_ID"
    r"|PyObject_Call\w*|_PyObject_Call\w*|PyObject_Vectorcall\w*|_PyObject_Vectorcall\w*|PyVectorcall_\w+"
    r"|_PyObject_FastCall\w*|PyCFunction_Call\w*"
    r"|PyEval_(?:Call|Eval|Get)\w*|PyRun_\w+|Py_CompileString\w*"
    r"|PyObject_Dir"
    r"|PyImport_\w+|PyCapsule_Import|PySys_GetObject\w*"
    r")\b"
    r"|(?:->|\.)\s*(?:tp_call|tp_getattro|tp_setattro|tp_getattr|tp_setattr|tp_descr_get|tp_descr_set)\b"
    r"(?!\s*=[^=])")

#: A function's definition at the start of a line: its name before the parenthesis of its parameters.
_DEFINITION = re.compile(r"^[A-Za-z_][\w \t\*]*?\b(\w+)\s*\([^;]*$")


def blank_comments_and_strings(text):
    """``text`` with its comments, string literals and character literals turned to spaces, newlines kept (so a
    name in a comment or a message is not a use, and line numbers hold)."""
    out, i, n = [], 0, len(text)
    while i < n:
        c = text[i]
        if text.startswith("/*", i):
            end = text.find("*/", i + 2)
            end = n if end < 0 else end + 2
        elif text.startswith("//", i):
            end = text.find("\n", i)
            end = n if end < 0 else end
        elif c in "\"'":
            end = i + 1
            while end < n and text[end] != c and text[end] != "\n":
                end += 2 if text[end] == "\\" else 1
            end = min(end + 1, n)
        else:
            out.append(c)
            i += 1
            continue
        out.append(re.sub(r"[^\n]", " ", text[i:end]))
        i = end
    return "".join(out)


def forbidden_uses(text):
    """``[(line, function, name)]``: each forbidden name used in the C source ``text`` (see the module doc), with
    the function it is in (the last definition begun at a line's start before it; "" outside any)."""
    found, function = [], ""
    for number, line in enumerate(blank_comments_and_strings(text).splitlines(), 1):
        d = _DEFINITION.match(line)
        if d is not None and d.group(1) not in ("if", "for", "while", "switch", "return", "sizeof"):
            function = d.group(1)
        for m in _FORBIDDEN.finditer(line):
            found.append((number, function, m.group(0).strip(".->\t ")))
    return found


def c_files(root=ROOT):
    """Every ``*.c`` and ``*.h`` under ``root``, as paths relative to it, sorted."""
    out = []
    for folder, _dirs, files in os.walk(root):
        for name in files:
            if name.endswith((".c", ".h")):
                out.append(os.path.relpath(os.path.join(folder, name), root))
    return sorted(out)


def test_no_c_file_reads_attributes_by_name_or_calls_back_into_python():
    files = c_files()
    assert any(f.endswith(".c") for f in files), "no C file found under %s" % ROOT
    bad = []
    for path in files:
        with open(os.path.join(ROOT, path), encoding="utf-8") as f:
            uses = forbidden_uses(f.read())
        bad += ["metaq/%s:%d (in %s): %s" % (path, line, function or "file scope", name)
                for line, function, name in uses]
    assert not bad, "C that reads attributes by name or calls back into Python:\n" + "\n".join(bad)


def test_the_scanner_names_a_file_line_and_function_for_an_attribute_read_by_name():
    text = ("/* PyObject_GetAttrString in a comment is no use */\n"
            "static PyObject *peek(PyObject *self, PyObject *obj) {\n"
            "    const char *why = \"PyObject_CallMethod in a message\";\n"
            "    return PyObject_GetAttrString(obj, \"_buf\");\n"
            "}\n")
    assert forbidden_uses(text) == [(4, "peek", "PyObject_GetAttrString")]


@pytest.mark.parametrize("use, name", [
    ("PyObject_SetAttr(o, n, v)", "PyObject_SetAttr"),
    ("PyObject_CallOneArg(fn, x)", "PyObject_CallOneArg"),
    ("PyObject_CallMethod(t, \"encode\", \"s\", \"ascii\")", "PyObject_CallMethod"),
    ("PyObject_VectorcallMethod(n, a, 1, NULL)", "PyObject_VectorcallMethod"),
    ("PyObject_GenericGetDict(p, NULL)", "PyObject_GenericGetDict"),
    ("PyUnicode_InternFromString(\"_pos\")", "PyUnicode_InternFromString"),
    ("PyImport_ImportModule(\"zlib\")", "PyImport_ImportModule"),
    ("Py_TYPE(o)->tp_call(o, a, NULL)", "tp_call"),
    ("Py_TYPE(o)->tp_getattro(o, n)", "tp_getattro"),
])
def test_the_scanner_finds_each_kind_of_forbidden_use(use, name):
    assert forbidden_uses("static PyObject *f(PyObject *o) {\n    return %s;\n}\n" % use) == [(2, "f", name)]


def test_the_scanner_lets_bytes_work_pass():
    text = ("static PyObject *scan(PyObject *self, PyObject *args) {\n"
            "    Py_buffer b;\n"
            "    if (PyObject_GetBuffer(args, &b, PyBUF_SIMPLE) < 0)\n"
            "        return PyErr_Format(PyExc_TypeError, \"not %.50s\", Py_TYPE(args)->tp_name);\n"
            "    PyObject *t = PyTuple_Type.tp_new(type, args, NULL);\n"
            "    PyObject *d = PyDict_New(), *v = PyDict_GetItemWithError(d, key);\n"
            "    return Py_BuildValue(\"(Nn)\", PyBytes_FromStringAndSize(b.buf, b.len), b.len);\n"
            "}\n"
            "static PyTypeObject T = {.tp_new = PyType_GenericNew, .tp_call = NULL};\n")
    assert forbidden_uses(text) == []
