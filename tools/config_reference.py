"""Write docs/configuration-reference.md: every broker setting, from the one schema.

The names, types, defaults and allowed ranges come from ``metaq.server.config.ServerConfig`` (the schema the
broker validates its file with); what each setting means comes from the comments of ``conf/server.yaml``, which
documents the settings one by one. Run it after changing either:

    python tools/config_reference.py            # rewrite the page
    python tools/config_reference.py --check    # exit 1 if the committed page differs from the generated one
"""

import argparse
import os
import re
import sys
import typing

import annotated_types
import yaml
from pydantic import BaseModel

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, ROOT)

from metaq.server.config import ServerConfig, _is_secret  # noqa: E402

PAGE = os.path.join(ROOT, "docs", "configuration-reference.md")
SHIPPED = os.path.join(ROOT, "conf", "server.yaml")

#: conf/server.yaml's comments name sections of the documentation; these become links to their pages.
SECTION_LINKS = {
    "Key index": "messaging.md#key-index",
    "Exactly once": "spark.md#the-idempotent-producer",
    "Request-reply": "messaging.md#request-reply",
    "Replication": "replication.md",
    "Delayed delivery": "messaging.md#delayed-delivery",
    "RocketMQ clients": "rocketmq.md",
    "RocketMQ 5 clients": "rocketmq5.md",
    "Topics: the table, create, alter, delete": "concepts.md#topics-the-table-create-alter-delete",
    "Operating metaq": "operating.md",
    "Security": "security.md",
}

KEY = re.compile(r"^(?P<indent>\s*)(?P<item>- )?(?P<key>[A-Za-z_][A-Za-z0-9_]*):(?P<rest>.*)$")


def shipped_comments(path=SHIPPED):
    """``{dotted setting: comment text}`` from the comment lines right above each key (and a key's own trailing
    comment). A section's comment is under its own name (``"store"``); a list's items under ``"topics.name"``."""
    found, pending, stack = {}, [], []  # stack: (indent, key)
    group = None  # (indent, dotted) of the key whose comment the keys right below it share
    with open(path, encoding="utf-8") as f:
        for line in f:
            line = line.rstrip("\n")
            stripped = line.strip()
            if not stripped:
                pending, group = [], None
                continue
            if stripped.startswith("#"):
                pending.append(stripped[1:].strip())
                continue
            m = KEY.match(line)
            if not m:
                pending, group = [], None
                continue
            indent = len(m.group("indent")) + (2 if m.group("item") else 0)
            while stack and stack[-1][0] >= indent:
                stack.pop()
            path_ = ".".join([k for _, k in stack] + [m.group("key")])
            rest = m.group("rest")
            trailing = re.search(r"\s#\s*(.*)$", rest)
            text = pending + ([trailing.group(1)] if trailing else [])
            if text and path_ not in found:
                found[path_] = " ".join(text)
                group = (indent, path_) if pending else None
            elif not text and group and group[0] == indent and rest.strip() and path_ not in found:
                found[path_] = "See `%s`." % group[1]  # one comment above a group of keys
            elif not text:
                group = None
            pending = []
            stack.append((indent, m.group("key")))
    return found


def _link_sections(text):
    def link(m):
        target = SECTION_LINKS.get(m.group(1))
        return "[%s](%s)" % (m.group(1), target) if target else '"%s"' % m.group(1)
    text = re.sub(r'README "([^"]+)"', link, text)
    return text.replace("|", "\\|")


def _type_name(annotation):
    origin = typing.get_origin(annotation)
    args = typing.get_args(annotation)
    if origin is typing.Union:
        names = [_type_name(a) for a in args if a is not type(None)]
        return " or ".join(names) + (" or null" if type(None) in args else "")
    if origin is typing.Literal:
        return " \\| ".join("`%s`" % a for a in args)
    if origin in (list, typing.List):
        return "list of %s" % _type_name(args[0])
    if isinstance(annotation, type) and issubclass(annotation, BaseModel) or annotation is dict or origin is dict:
        return "mapping"
    return {int: "integer", float: "number", str: "string", bool: "true/false"}.get(annotation, str(annotation))


def _bounds(field):
    parts = []
    for m in field.metadata:
        for name, sign in (("ge", "≥"), ("gt", ">"), ("le", "≤"), ("lt", "<")):
            value = getattr(m, name, None)
            if isinstance(m, (annotated_types.Ge, annotated_types.Gt, annotated_types.Le, annotated_types.Lt)) \
                    and value is not None:
                parts.append("%s %s" % (sign, value))
    return ", ".join(parts)


def _size(value):
    for unit, shift in (("GiB", 30), ("MiB", 20), ("KiB", 10)):
        if value >= 1 << shift and value % (1 << shift) == 0:
            return " (%d %s)" % (value >> shift, unit)
    return ""


def _value(value):
    if value is None:
        return "null"
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, list):
        return ", ".join(_value(v) for v in value) or "[]"
    if isinstance(value, dict):
        return "{%s}" % ", ".join("%s: %s" % (k, v) for k, v in value.items())
    return str(value)


def _rows(model_cls, default, shipped, comments, prefix):
    """Table rows for the leaf settings of ``model_cls`` (a section), and nested sections after."""
    rows, nested = [], []
    for name, field in model_cls.model_fields.items():
        dotted = "%s.%s" % (prefix, name)
        annotation = field.annotation
        value = getattr(default, name)
        if isinstance(value, BaseModel):
            nested.append((dotted, type(value), value, (shipped or {}).get(name)))
            continue
        shown = "`%s`" % _value(value)
        if isinstance(value, int) and not isinstance(value, bool) and name.endswith(("_bytes", "_size")):
            shown += _size(value)
        if shipped is not None and name in shipped and shipped[name] != value:
            shown += " (`conf/server.yaml`: `%s`)" % _value(shipped[name])
        meaning = _link_sections(comments.get(dotted, ""))
        if _is_secret(field):
            meaning += " A secret: every view of the configuration shows it as `<redacted>`."
        rows.append("| `%s` | %s | %s | %s | %s |" % (dotted, _type_name(annotation), shown, _bounds(field),
                                                    meaning.strip()))
    return rows, nested


def render():
    comments = shipped_comments()
    with open(SHIPPED, encoding="utf-8") as f:
        shipped = yaml.safe_load(f)
    default = ServerConfig()
    out = [
        "# Every setting",
        "",
        "Every setting of `metaq-server`'s configuration file, generated from the schema the broker checks the",
        "file against (names, types, defaults, allowed values) and from the comments of `conf/server.yaml` (what",
        "each one means). Where `conf/server.yaml`, the file `make run` uses, differs from the built-in default,",
        "both are shown. How the file is read, what is refused and the flags that override it:",
        "[Configuration](configuration.md).",
        "",
        "This page is generated: `python tools/config_reference.py` rewrites it, and a test fails when it is",
        "out of date.",
    ]
    for name, field in ServerConfig.model_fields.items():
        value = getattr(default, name)
        out += ["", "## `%s`" % name, ""]
        if comments.get(name):
            out += [_link_sections(comments[name]), ""]
        if isinstance(value, BaseModel):
            pending = [(name, type(value), value, shipped.get(name))]
            header = False
            while pending:
                prefix, cls, val, ship = pending.pop(0)
                rows, nested = _rows(cls, val, ship, comments, prefix)
                if rows:
                    if prefix != name:
                        out += ["" if header else "", "### `%s`" % prefix, ""]
                        if comments.get(prefix):
                            out += [_link_sections(comments[prefix]), ""]
                    out += ["| setting | type | default | allowed | meaning |", "|---|---|---|---|---|"] + rows
                    header = True
                pending = nested + pending
        else:  # topics: a list of entries
            item_cls = typing.get_args(field.annotation)[0]
            out += ["Default: `%s`; `conf/server.yaml`: `%s`. Each entry:" % (
                _value([v.model_dump() for v in value]), _value(shipped.get(name))), ""]
            out += ["| key | type | default | allowed | meaning |", "|---|---|---|---|---|"]
            for key, f in item_cls.model_fields.items():
                shown = "required" if f.is_required() else "`%s`" % _value(f.default)
                out.append("| `%s` | %s | %s | %s | %s |" % (key, _type_name(f.annotation), shown, _bounds(f),
                                                            _link_sections(comments.get("%s.%s" % (name, key), ""))))
    return "\n".join(out).replace("\n\n\n", "\n\n") + "\n"


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--check", action="store_true", help="exit 1 if the page is not the generated one")
    args = parser.parse_args(argv)
    text = render()
    if args.check:
        with open(PAGE, encoding="utf-8") as f:
            if f.read() != text:
                print("%s is out of date: run python tools/config_reference.py" % os.path.relpath(PAGE, ROOT))
                return 1
        return 0
    with open(PAGE, "w", encoding="utf-8") as f:
        f.write(text)
    return 0


if __name__ == "__main__":
    sys.exit(main())
