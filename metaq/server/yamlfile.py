"""YAML files as the broker reads them: a key written twice in a mapping is an error (PyYAML keeps the last),
and a bad file is a ``ConfigError`` naming file and line (``server.yaml``, the permissions file, inventories)."""

import yaml

from metaq.errors import ConfigError

__all__ = ["UniqueKeyLoader", "DuplicateKey", "read_yaml"]


class UniqueKeyLoader(yaml.SafeLoader):
    """YAML's SafeLoader, except that a mapping naming one key twice is an error (PyYAML keeps the last).

    A merge (``<<: *base``) may still override what it brings in: only the keys written in the
    mapping itself are compared.
    """

    def construct_mapping(self, node, deep=False):
        if isinstance(node, yaml.MappingNode):
            seen = {}
            for key_node, _value in node.value:
                if key_node.tag == "tag:yaml.org,2002:merge":
                    continue
                key = self.construct_object(key_node, deep=True)
                try:
                    first = seen.setdefault(key, key_node)
                except TypeError:  # an unhashable key: SafeLoader's own error follows
                    continue
                if first is not key_node:
                    raise DuplicateKey(key, key_node.start_mark.line + 1, first.start_mark.line + 1)
        return super().construct_mapping(node, deep)


class DuplicateKey(yaml.YAMLError):
    def __init__(self, key, line, first_line):
        super().__init__("line %d: key %r is written a second time in the same mapping (first at line %d); "
                         "YAML would silently keep the last: keep one" % (line, key, first_line))


def _yaml_problem(exc):
    """A YAML error on one line: where (line, column) and what, without PyYAML's multi-line snippet."""
    mark = getattr(exc, "problem_mark", None)
    problem = getattr(exc, "problem", None) or str(exc).splitlines()[0]
    context = getattr(exc, "context", None)
    text = "%s %s" % (context, problem) if context else problem
    if mark is not None:
        return "line %d, column %d: %s" % (mark.line + 1, mark.column + 1, text)
    return text


def read_yaml(path):
    """The YAML document of ``path``, refusing a key written twice in a mapping; ConfigError naming file and line."""
    try:
        with open(path, encoding="utf-8") as f:
            return yaml.load(f, Loader=UniqueKeyLoader)
    except OSError as exc:
        raise ConfigError("cannot read configuration file %s: %s" % (path, exc.strerror)) from None
    except UnicodeDecodeError as exc:
        raise ConfigError("configuration file %s is not UTF-8 text: %s" % (path, exc.reason)) from None
    except DuplicateKey as exc:
        raise ConfigError("configuration file %s, %s" % (path, exc)) from None
    except yaml.YAMLError as exc:
        raise ConfigError("configuration file %s is not valid YAML: %s" % (path, _yaml_problem(exc))) from None
