"""README "Topics: the table, create, alter, delete": each change goes to every broker of `--brokers`; the exit
code is 3 if one refused, with its reason on stderr, and the brokers that accepted it are changed."""

import json
import subprocess
import sys

from metaq.client.local import small_config
from tests.harness.broker import url_of

ADMIN = [sys.executable, "-m", "metaq.admincli"]


def admin(urls, *args, expect=0):
    out = subprocess.run(ADMIN + ["--brokers", ",".join(urls)] + list(args), capture_output=True, text=True,
                         timeout=60, stdin=subprocess.DEVNULL)
    assert out.returncode == expect, (out.returncode, out.stdout, out.stderr)
    return out


def listed(url):
    return {r["topic"]: r for r in json.loads(admin([url], "--json", "topics").stdout)}


def test_create_on_two_brokers_exits_3_when_one_refuses_and_the_other_is_changed(broker_factory, tmp_path):
    one = broker_factory(config=small_config(str(tmp_path / "d1"), broker={"id": 1}))
    two = broker_factory(config=small_config(str(tmp_path / "d2"), broker={"id": 2}))
    urls = [url_of(one), url_of(two)]
    admin([urls[0]], "topics", "create", "orders", "--partitions", "3")  # already on the first
    out = admin(urls, "topics", "create", "orders", "--partitions", "5", expect=3)
    assert "broker 1 refused topics create orders (400): topic orders exists" in out.stderr, out.stderr
    assert "broker 2" not in out.stderr, out.stderr
    assert listed(urls[1])["orders"]["partitions"] == 5  # the other broker was changed
    assert listed(urls[0])["orders"]["partitions"] == 3  # the refusing one kept its table
