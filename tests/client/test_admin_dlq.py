"""metaq-admin dlq list / dlq resend against a real broker with a RocketMQ dead letter made by send-back, and the
README "Admin commands" block run as written (README "Operating metaq › Admin commands")."""

import json
import os
import pathlib
import re
import subprocess
import sys

import pytest
import yaml

from metaq.client.local import BrokerProcess, rmq_config
from metaq.protocol import events as ev
from metaq.client.raw import RemotingClient
from metaq.protocol.rocketmq.bodies import decode_stored_messages, parse_offset_msg_id
from metaq.protocol.rocketmq.remoting import RequestCode as R
from metaq.protocol.rocketmq.remoting import ResponseCode as C
from tests.harness.broker import url_of
from tests.harness.rocketmq import pull, send_v1

ADMIN = [sys.executable, "-m", "metaq.admincli"]
ROOT = pathlib.Path(__file__).resolve().parents[2]


def admin(*args, expect=0, stdin=None):
    out = subprocess.run(ADMIN + list(args), capture_output=True, input=stdin, timeout=60)
    assert out.returncode == expect, (out.returncode, out.stdout, out.stderr)
    return out


def test_dlq_list_then_resend_puts_it_back_once(broker_factory, tmp_path):
    b = broker_factory(rmq_config(tmp_path / "data", remoting={"max_reconsume_times": 1, "send_back_delay_level": 0}))
    url = url_of(b)
    out = admin("--brokers", url, "dlq", "list", "CGD", expect=3)  # no such group's dead letters yet: a typo?
    assert b"no topic %DLQ%CGD" in out.stderr
    with RemotingClient(b.config["remoting"]["port"]) as rc:
        sent = send_v1(rc, "tD", b"poison", props={"TAGS": "P", "KEYS": "k1", "UNIQ_KEY": "U1"})
        physical = parse_offset_msg_id(sent.ext_fields["msgId"])[2]
        back = {"offset": physical, "group": "CGD", "delayLevel": -1, "originMsgId": "U1", "originTopic": "tD"}
        assert rc.call(R.CONSUMER_SEND_MSG_BACK, back).code == C.SUCCESS  # straight to the dead letters
        [letter] = json.loads(admin("--brokers", url, "--json", "dlq", "list", "CGD").stdout)
        assert (letter["id"], letter["topic"], letter["resent"]) == ("U1", "tD", False)
        [done] = json.loads(admin("--brokers", url, "--json", "dlq", "resend", "CGD").stdout)
        assert (done["id"], done["status"], done["topic"]) == ("U1", "resent", "tD")
        partition, offset = int(done["partition"].split("-")[1]), done["offset"]
        [msg] = decode_stored_messages(pull(rc, "tD", partition, offset).body)
        assert msg.body == b"poison" and msg.properties["TAGS"] == "P" and msg.properties["KEYS"] == "k1"
        assert "RETRY_TOPIC" not in msg.properties and "METAQ_DLQ_RESENT" in msg.properties
    [again] = json.loads(admin("--brokers", url, "--json", "dlq", "resend", "CGD").stdout)
    assert again["status"] == "skipped: already resent"  # the journal remembers it
    b.stop()
    b.start()
    [after] = json.loads(admin("--brokers", url_of(b), "--json", "dlq", "resend", "CGD").stdout)
    assert after["status"] == "skipped: already resent"  # the journal is a topic: it survives the restart
    [listed] = json.loads(admin("--brokers", url_of(b), "--json", "dlq", "list", "CGD").stdout)
    assert listed["resent"] is True


@pytest.mark.integration
def test_readme_admin_commands_run_as_written(tmp_path):
    """docs/operating.md's "Admin commands" ```sh block, on a fresh broker configured like `make run`'s: put, tail,
    reset-offsets (refused, then a dry run after a commit), dlq list (refused: no dead letters)."""
    with open(ROOT / "conf" / "server.yaml") as f:
        cfg = yaml.safe_load(f)
    cfg["broker"].update(port=0, data_dir=str(tmp_path / "data"))
    cfg["http"]["port"] = 0
    cfg["mqtt"]["port"] = 0
    b = BrokerProcess(tmp_path, cfg).start()
    try:
        from tests.harness.docs import section as doc_section

        [code] = re.findall(r"```sh\n(.*?)```", doc_section("operating.md", "Admin commands"), re.S)
        env = dict(os.environ, PATH=os.path.dirname(sys.executable) + ":" + os.environ["PATH"])
        out = subprocess.run(["bash", "-euo", "pipefail", "-c", code.replace("8123", str(b.port))], cwd=str(ROOT),
                             env=env, capture_output=True, text=True, timeout=120)
        assert out.returncode == 0, (out.stdout, out.stderr)
        lines = out.stdout.splitlines()
        assert re.fullmatch(r"\d+ 0-0 0", lines[0]) and re.fullmatch(r"\d+ 0-0 1", lines[1]), lines  # put
        assert lines[2:4] == ["0-0 0 - - hello", "0-0 1 - - world"]  # tail
        assert json.loads(lines[4])["body"] == "hello"  # tail --json --from a time before it
        assert lines[5] == "exit 3" and "billing has no committed offsets for topic test" in out.stderr
        assert lines[6] == "result 200 0 1"  # the commit
        assert lines[9].split() == ["test", "0-0", "2", "0", "0", "2", "broker"], lines  # the dry run's row
        assert "dry run: nothing changed" in out.stderr
        assert lines[10:] == ["exit 3"] and "no broker has dead letters of group billing" in out.stderr
        with b.client() as c:
            assert c.call(ev.QueryOffset("billing", "test", 0, c.opaque())).body == b"2"  # a dry run
    finally:
        b.kill()
