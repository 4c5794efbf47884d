"""metaq-admin dlq list / dlq resend against a real broker with a RocketMQ dead letter made by send-back, and the
README "Admin commands" block run as written (README "Operating metaq › Admin commands")."""

import json
import pathlib
import re
import shlex
import subprocess
import sys

from metaq.client.local import rmq_config
from metaq.client.raw import RemotingClient
from metaq.protocol.rocketmq.bodies import decode_stored_messages, parse_offset_msg_id
from metaq.protocol.rocketmq.remoting import RequestCode as R
from metaq.protocol.rocketmq.remoting import ResponseCode as C
from tests.harness.broker import url_of
from tests.harness.rocketmq import pull, send_v1

ADMIN = [sys.executable, "-m", "metaq.client.admin"]
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


def test_readme_admin_commands_run_as_written(broker):
    text = (ROOT / "README.md").read_text()
    section = text[text.index("### Admin commands"):]
    block = re.search(r"```\n(.*?)```", section, re.S).group(1)
    lines = [line for line in block.splitlines() if line.strip()]
    assert len(lines) == 3 and "put test" in lines[0] and "--follow" not in block
    outs = []
    for line in lines:
        line = line.replace("meta://127.0.0.1:8123", url_of(broker)).replace(".venv/bin/metaq-admin",
                                                                             shlex.join(ADMIN))
        r = subprocess.run(["bash", "-euo", "pipefail", "-c", line], capture_output=True, text=True, timeout=60)
        assert r.returncode == 0, (line, r.stdout, r.stderr)
        outs.append(r.stdout)
    assert [row.split()[2] for row in outs[0].splitlines()] == ["0", "1"]  # <id> <partition> <offset>
    assert [row.split(" ", 4)[-1] for row in outs[1].splitlines()] == ["hello", "world"]
    [first] = [json.loads(row) for row in outs[2].splitlines()]
    assert first["offset"] == 0 and first["body"] == "hello"
