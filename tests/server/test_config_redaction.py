"""Issue 42 point 1: every view of the configuration is the parsed one, secrets redacted, whatever YAML form
gave them. The raw file text is never shown (a line pattern over it missed flow style and block scalars)."""

import typing

import pytest
import yaml
from pydantic import BaseModel

from metaq.server.config import REDACTED, ServerConfig, load_config

SECRET = "s3cr3t-replication-0123456789abcdef"

#: The same secret in every YAML form a user may write it in.
FORMS = {
    "block": "security:\n  replication_secret: %s\n" % SECRET,
    "double quoted": 'security:\n  replication_secret: "%s"\n' % SECRET,
    "single quoted": "security:\n  replication_secret: '%s'\n" % SECRET,
    "flow": 'security: {acl_file: null, replication_secret: "%s"}\n' % SECRET,
    "flow, key quoted": "{security: {'replication_secret': %s}}\n" % SECRET,
    "folded block scalar": "security:\n  replication_secret: >-\n    %s\n" % SECRET,
    "literal block scalar": "security:\n  replication_secret: |-\n    %s\n" % SECRET,
    "folded over two lines": "security:\n  replication_secret: >-\n    %s\n    %s\n" % (SECRET[:12], SECRET[12:]),
    "anchor": "security: &sec\n  replication_secret: &s %s\n" % SECRET,
    "anchored flow mapping": "security: &sec {replication_secret: %s}\nreplication: {}\n" % SECRET,
    "merge key": "security:\n  <<: {replication_secret: %s}\n" % SECRET,
    "escaped": 'security:\n  replication_secret: "%s"\n' % "".join("\\x%02x" % ord(c) for c in SECRET),
}


def _load(tmp_path, text):
    path = tmp_path / "server.yaml"
    path.write_text(text)
    return load_config(str(path))


@pytest.mark.parametrize("form", sorted(FORMS))
def test_every_yaml_form_of_the_secret_is_redacted(tmp_path, form):
    config = _load(tmp_path, FORMS[form])
    expected = SECRET.replace(" ", "") if form != "folded over two lines" else SECRET[:12] + " " + SECRET[12:]
    assert config.security.replication_secret == expected, "the form must give the secret to the broker"
    shown = config.redacted_text().decode("utf-8")
    for piece in (SECRET, SECRET[:12], SECRET[12:], SECRET[-16:]):
        assert piece not in shown
    assert yaml.safe_load(shown)["security"]["replication_secret"] == REDACTED
    assert config.redacted_dump()["security"]["replication_secret"] == REDACTED


def test_the_view_is_the_parsed_configuration_and_keeps_everything_else(tmp_path):
    config = _load(tmp_path, "# a comment with %s in it\nbroker: {port: 8199}\nsecurity:\n  replication_secret: %s\n"
                   % (SECRET, SECRET))
    shown = config.redacted_text().decode("utf-8")
    assert SECRET not in shown and "comment" not in shown
    view = yaml.safe_load(shown)
    assert view["broker"]["port"] == 8199 and view["store"]["segment_size"] == config.store.segment_size
    assert config.security.replication_secret == SECRET  # the broker itself still has it


def test_no_secret_set_shows_none_not_a_redaction(tmp_path):
    assert yaml.safe_load(load_config(None).redacted_text())["security"]["replication_secret"] is None


def _string_fields(model, prefix=""):
    for name, field in model.model_fields.items():
        inner = [a for a in (field.annotation, *typing.get_args(field.annotation))
                 if isinstance(a, type) and issubclass(a, BaseModel)]
        if inner:
            yield from _string_fields(inner[0], prefix + name + ".")
        else:
            yield prefix + name, field


def test_every_setting_that_holds_a_secret_is_marked_so():
    # a new secret setting (a password, a token) must be marked or every view would show it
    for dotted, field in _string_fields(ServerConfig):
        leaf = dotted.rsplit(".", 1)[-1]
        holds_secret = any(w in leaf for w in ("secret", "password", "token", "passphrase")) and \
            not leaf.endswith("_file")
        assert holds_secret == bool((field.json_schema_extra or {}).get("secret")), dotted

