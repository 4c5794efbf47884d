"""One function per decision: the helpers (and the message-id layout) every module shares are defined once, in the
module named here, and a second definition anywhere in metaq/ fails this test (import the one instead)."""

import ast
import pathlib

ROOT = pathlib.Path(__file__).resolve().parent.parent / "metaq"

#: function name -> the one module (relative to metaq/) that may define it.
ONE_HOME = {
    "now_ms": "clock.py",  # the broker's wall clock, in milliseconds
    "_now_ms": None,  # no private variant either
    "parse_int": "protocol/integers.py",  # a command's integer field: strict decimal, range-checked
    "_int": None,
    "is_integer": "protocol/integers.py",
    "_is_integer": None,
    "id_timestamp_ms": "protocol/msgid.py",  # message ids' layout, read
    "id_broker": "protocol/msgid.py",
    "compose": "protocol/msgid.py",  # and made (store/msgid.py's IdGenerator hands them out)
    "TWEPOCH": "protocol/msgid.py",
    "TIMESTAMP_SHIFT": "protocol/msgid.py",
    "SEQUENCE_BITS": "protocol/msgid.py",
    "BROKER_BITS": "protocol/msgid.py",
    "IdGenerator": "store/msgid.py",
    "encode_properties": "protocol/properties.py",  # the stored format's properties, RocketMQ's wire's too
    "decode_properties": "protocol/properties.py",
    "encode_attribute": "protocol/properties.py",  # a record's attribute: tags, then its properties
    "split_attribute": "protocol/properties.py",
    "_token": None,  # a serializer's field checked as one token: protocol/commands.py token
}


def _defined(node):
    """The names ``node`` defines: a function, method or class, or a variable assigned."""
    if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
        return [node.name]
    if isinstance(node, ast.Assign):
        return [t.id for t in node.targets if isinstance(t, ast.Name)]
    return []


def definitions(root=ROOT):
    """``(module, name, line)`` of every definition in metaq/ of a name of ONE_HOME."""
    found = []
    for path in sorted(root.rglob("*.py")):
        for node in ast.walk(ast.parse(path.read_text(), str(path))):
            module = str(path.relative_to(root))
            found.extend((module, name, node.lineno) for name in _defined(node) if name in ONE_HOME)
    return found


def test_each_shared_helper_is_defined_once_in_its_home():
    strays = [d for d in definitions() if ONE_HOME[d[1]] != d[0]]
    assert strays == [], "define these once, in %s, and import them: %s" % (ONE_HOME, strays)
    homes = {name for _module, name, _line in definitions()}
    assert homes == {name for name, home in ONE_HOME.items() if home is not None}


def test_the_check_finds_a_second_copy(tmp_path):
    (tmp_path / "server").mkdir()
    (tmp_path / "clock.py").write_text("def now_ms():\n    return 0\n")
    (tmp_path / "server" / "other.py").write_text("class A:\n    def now_ms(self):\n        return 1\n")
    (tmp_path / "spark.py").write_text("TWEPOCH = 1303895660503\n")
    assert definitions(tmp_path) == [("clock.py", "now_ms", 1), ("server/other.py", "now_ms", 2),
                                     ("spark.py", "TWEPOCH", 1)]
