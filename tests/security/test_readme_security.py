"""docs/security.md: its Python example runs as written and prints what the text says, and the
``openssl dgst`` line computes the same proof as ``metaq.auth.proofs``."""

import os
import pathlib
import re
import subprocess
import sys

from metaq.auth import proofs
from tests.harness.docs import read

ROOT = pathlib.Path(__file__).resolve().parents[2]


def section():
    return read("security.md")


def test_the_security_example_runs_as_written(tmp_path):
    blocks = re.findall(r"```python\n(.*?)```", section(), re.S)
    runnable = [b for b in blocks if "BrokerProcess" in b]
    assert len(runnable) == 1, "docs/security.md lost its runnable example"
    env = dict(os.environ, HOME=str(tmp_path), PYTHONPATH=str(ROOT))
    for name in list(env):
        if name.startswith("METAQ_"):
            del env[name]
    out = subprocess.run([sys.executable, "-c", runnable[0]], cwd=str(tmp_path), env=env, capture_output=True,
                         text=True, timeout=120)
    assert out.returncode == 0, out.stderr
    assert out.stdout.split() == ["True", "Forbidden", "Unauthenticated"], out


def test_the_openssl_line_computes_the_client_proof():
    line = re.search(r"printf '(metaq-auth-1 client [^']+)' \\\n\s+\| openssl dgst -sha256 -hmac '([^']+)'",
                     section())
    assert line, "the openssl example changed shape"
    words, secret = line.group(1), line.group(2)
    out = subprocess.run(["openssl", "dgst", "-sha256", "-hmac", secret], input=words.encode(),
                         capture_output=True, check=True, timeout=30).stdout.decode().split()[-1]
    tokens = words.split()
    user, nonce, client_nonce = tokens[2], " ".join(tokens[3:-1]), tokens[-1]  # the nonce is a placeholder
    assert out == proofs.text_proof(secret.encode(), "client", user, nonce, client_nonce)


def test_the_yaml_examples_are_valid_settings():
    import yaml

    from metaq.auth.acl import parse_acl
    from metaq.server.config import ServerConfig

    blocks = [yaml.safe_load(b) for b in re.findall(r"```yaml\n(.*?)```", section(), re.S)]
    acls = [b for b in blocks if "users" in b]
    servers = [b for b in blocks if "security" in b]
    assert acls and servers
    for doc in acls:
        assert parse_acl(doc).users
    for doc in servers:
        ServerConfig.model_validate(doc)
    acl = parse_acl(yaml.safe_load((ROOT / "conf" / "acl.example.yaml").read_text()))
    assert acl.user("ops").admin and not acl.user("dashboards").admin
