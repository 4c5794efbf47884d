"""metaq.client.security without a network: where credentials come from, files refused for their mode, the
secret never shown, the command-line flags, the Spark source's options."""

import argparse
import logging
import os
import pickle
import ssl

import pytest
import yaml

from metaq import errors
from metaq.client import security as client_security
from metaq.client.security import ClientSecurity
from metaq.spark.ranges import read_options, security_options
from tests.harness.pki import Pki

SECRET = "s3cret-value-that-must-not-leak"


def private_file(path, text, mode=0o600):
    with open(path, "w") as f:
        f.write(text)
    os.chmod(path, mode)
    return str(path)


def credentials_file(tmp_path, doc, mode=0o600, name="creds.yaml"):
    return private_file(tmp_path / name, yaml.safe_dump(doc), mode)


@pytest.fixture(scope="module")
def pki(tmp_path_factory):
    return Pki(tmp_path_factory.mktemp("pki"))


def test_arguments_and_nothing_at_all():
    sec = ClientSecurity("alice", SECRET)
    assert (sec.enabled, sec.user, sec.tls, sec.ssl_context()) == (True, "alice", False, None)
    none = ClientSecurity.from_env({})
    assert (none.enabled, none.tls) == (False, False)


def test_environment_with_a_secret_file_and_tls(tmp_path, pki):
    secret_file = private_file(tmp_path / "secret", SECRET + "\n")
    sec = ClientSecurity.from_env({"METAQ_USER": "alice", "METAQ_SECRET_FILE": secret_file, "METAQ_TLS_CA": pki.ca})
    assert sec.user == "alice" and sec.tls and sec.ca == pki.ca
    assert isinstance(sec.ssl_context(), ssl.SSLContext)
    assert sec.ssl_context().verify_mode == ssl.CERT_REQUIRED and sec.ssl_context().check_hostname
    # the secret file's trailing newline is not part of the secret: the same proof as the secret given directly
    assert sec._secret == SECRET.encode()  # noqa: SLF001 - the one place a test looks at it
    assert ClientSecurity.from_env({"METAQ_TLS": "yes"}).tls is True
    with pytest.raises(errors.ConfigError, match="METAQ_TLS must be"):
        ClientSecurity.from_env({"METAQ_TLS": "maybe"})


def test_credentials_file_with_relative_paths_and_env_overrides(tmp_path, pki):
    os.symlink(pki.ca, tmp_path / "ca.pem")
    private_file(tmp_path / "alice.secret", SECRET)
    path = credentials_file(tmp_path, {"user": "alice", "secret_file": "alice.secret", "tls": {"ca": "ca.pem"}})
    sec = ClientSecurity.from_env({"METAQ_CREDENTIALS": path})
    assert (sec.user, sec.tls, sec.ca) == ("alice", True, str(tmp_path / "ca.pem"))
    assert path in sec.source
    # an explicit credentials file wins over the environment's
    other = credentials_file(tmp_path, {"user": "bob", "secret": "bob-secret"}, name="bob.yaml")
    assert ClientSecurity.from_options(credentials=other, environ={"METAQ_CREDENTIALS": path}).user == "bob"
    # the environment's variables override its credentials file; a user with no secret of its own is refused
    with pytest.raises(errors.ConfigError, match="user bob has no secret"):
        ClientSecurity.from_env({"METAQ_CREDENTIALS": path, "METAQ_USER": "bob"})
    sec = ClientSecurity.from_env({"METAQ_CREDENTIALS": path, "METAQ_USER": "bob", "METAQ_SECRET": "x"})
    assert sec.user == "bob" and sec.tls  # the file's TLS settings stay


@pytest.mark.parametrize("mode", [0o644, 0o640, 0o604, 0o660])
def test_files_holding_a_secret_readable_by_others_are_refused(tmp_path, mode):
    path = credentials_file(tmp_path, {"user": "alice", "secret": SECRET}, mode=mode)
    with pytest.raises(errors.ConfigError) as exc:
        ClientSecurity.from_file(path)
    text = str(exc.value)
    assert "group or others" in text and "mode %04o" % mode in text and "chmod 600 %s" % path in text
    assert SECRET not in text
    secret = private_file(tmp_path / "secret", SECRET, mode)
    with pytest.raises(errors.ConfigError, match="METAQ_SECRET_FILE .* group or others"):
        ClientSecurity.from_env({"METAQ_USER": "alice", "METAQ_SECRET_FILE": secret})
    with pytest.raises(errors.ConfigError, match="secret file .* group or others"):
        ClientSecurity.from_options(user="alice", secret_file=secret, environ={})


def test_a_tls_key_readable_by_others_is_refused(tmp_path, pki):
    key = tmp_path / "client.key"
    key.write_bytes(open(pki.client_key, "rb").read())
    os.chmod(key, 0o644)
    with pytest.raises(errors.ConfigError, match="TLS key .* group or others"):
        ClientSecurity(ca=pki.ca, cert=pki.client_cert, key=str(key))
    os.chmod(key, 0o600)
    assert ClientSecurity(ca=pki.ca, cert=pki.client_cert, key=str(key)).tls


@pytest.mark.parametrize("doc, message", [
    ("- just a list", "expected a mapping"),
    ("user: alice\nsecret: x\npassword: y\n", "unknown keys password"),
    ("user: alice\n", "a user needs its secret"),
    ("secret: x\n", "a secret was given without a user"),
    ("user: alice\nsecret: x\nsecret_file: f\n", "secret and secret_file are both set"),
    ("user: al ice\nsecret: x\n", "invalid user name"),
    ("user: alice\nsecret: x\ntls: {ca: ca.pem, verify: no}\n", "unknown tls keys verify"),
    ("user: alice\nsecret: x\ntls: 3\n", "tls must be true, false or a mapping"),
    ("user: alice\nsecret: x\ntls: {ca: missing.pem}\n", "cannot load the CA file"),
    ("user: [alice\n", "not valid YAML"),
])
def test_bad_credentials_files_are_refused_with_the_reason(tmp_path, doc, message):
    path = private_file(tmp_path / "creds.yaml", doc)
    with pytest.raises(errors.ConfigError, match=message) as exc:
        ClientSecurity.from_file(path)
    assert path in str(exc.value)


def test_oversized_and_missing_files(tmp_path):
    big = private_file(tmp_path / "big.yaml", "user: alice\nsecret: %s\n" % ("x" * (70 * 1024)))
    with pytest.raises(errors.ConfigError, match="larger than"):
        ClientSecurity.from_file(big)
    with pytest.raises(errors.ConfigError, match="cannot read credentials file .*No such file"):
        ClientSecurity.from_file(tmp_path / "nope.yaml")
    long_secret = private_file(tmp_path / "long.yaml", "user: alice\nsecret: %s\n" % ("x" * 2000))
    with pytest.raises(errors.ConfigError, match="must be 1-1024 bytes"):
        ClientSecurity.from_file(long_secret)


def test_the_secret_is_in_no_repr_no_pickle_text_and_no_log(tmp_path, pki, caplog):
    caplog.set_level(logging.DEBUG)
    path = credentials_file(tmp_path, {"user": "alice", "secret": SECRET, "tls": {"ca": pki.ca}})
    sec = ClientSecurity.from_file(path)
    assert SECRET not in repr(sec) and "secret=<hidden>" in repr(sec) and "alice" in repr(sec)
    assert SECRET not in str(vars(sec).get("source"))
    copy = pickle.loads(pickle.dumps(sec))  # a ClientSecurity travels (its SSLContext is made again)
    assert copy.user == "alice" and isinstance(copy.ssl_context(), ssl.SSLContext)
    assert SECRET not in caplog.text


def test_command_line_flags(tmp_path):
    parser = client_security.add_arguments(argparse.ArgumentParser())
    secret = private_file(tmp_path / "secret", SECRET)
    args = parser.parse_args(["--user", "alice", "--secret-file", secret])
    sec = client_security.from_cli(args)
    assert (sec.user, sec.tls) == ("alice", False)
    with pytest.raises(errors.ConfigError, match="user alice was given without its secret"):
        client_security.from_cli(parser.parse_args(["--user", "alice"]))
    path = credentials_file(tmp_path, {"user": "bob", "secret": "bob-secret"})
    assert client_security.from_cli(parser.parse_args(["--credentials", path])).user == "bob"


def test_resolve_takes_what_callers_pass(tmp_path, monkeypatch):
    for name in list(os.environ):
        if name.startswith("METAQ_"):
            monkeypatch.delenv(name)
    assert client_security.resolve(None).enabled is False
    monkeypatch.setenv("METAQ_USER", "alice")
    monkeypatch.setenv("METAQ_SECRET", SECRET)
    assert client_security.resolve(None).user == "alice"  # the default picks the environment up
    sec = ClientSecurity("bob", "x")
    assert client_security.resolve(sec) is sec
    path = credentials_file(tmp_path, {"user": "reader", "secret": "r"})
    assert client_security.resolve(path).user == "reader"
    assert client_security.resolve({"credentials": path}).user == "reader"
    with pytest.raises(TypeError):
        client_security.resolve(42)


def test_spark_options_carry_paths_never_a_secret():
    opts = read_options({"credentials": "/etc/metaq/spark.yaml", "TLS": "true", "secretFile": "/s", "user": "u"})
    assert security_options(opts) == {"credentials": "/etc/metaq/spark.yaml", "tls": True, "secret_file": "/s",
                                      "user": "u"}
    assert security_options(read_options({"topic": "t"})) == {}
    with pytest.raises(ValueError, match="no 'secret' option"):
        security_options(read_options({"secret": SECRET}))


def test_the_inventory_takes_a_credentials_path_on_the_host():
    from metaq.deploy.inventory import InventoryError, parse_inventory

    doc = {"defaults": {"credentials": "/etc/metaq/agent.yaml"},
           "brokers": [{"name": "b0", "host": "127.0.0.1", "broker_id": 0},
                       {"name": "b1", "host": "127.0.0.1", "broker_id": 1, "port": 8124,
                        "install_dir": "/opt/metaq1", "data_dir": "/var/lib/metaq1",
                        "credentials": "/etc/metaq/b1.yaml"}]}
    b0, b1 = parse_inventory(yaml.safe_dump(doc)).brokers
    assert (b0.credentials, b1.credentials) == ("/etc/metaq/agent.yaml", "/etc/metaq/b1.yaml")
    doc["defaults"]["credentials"] = "agent.yaml"
    with pytest.raises(InventoryError, match="defaults.credentials: must be an absolute path"):
        parse_inventory(yaml.safe_dump(doc))
