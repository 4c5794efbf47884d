"""README "Retention": a RocketMQ pull below the first offset a topic's own retention moved answers
`PULL_OFFSET_MOVED` with the first kept offset, and the pull from there reads the kept messages."""

import os
import subprocess
import sys

from metaq.client.local import rmq_config
from metaq.client.raw import RemotingClient
from metaq.protocol.rocketmq.bodies import decode_stored_messages
from metaq.protocol.rocketmq.remoting import ResponseCode as C
from tests.harness.broker import url_of, wait_for
from tests.harness.rocketmq import pull, send_v1

ADMIN = [sys.executable, "-m", "metaq.admincli"]


def test_a_pull_below_a_topics_retention_is_told_the_first_kept_offset(broker_factory):
    cfg = rmq_config("/nonexistent", store={"retention_check_interval_s": 0.2})
    b = broker_factory(cfg, start=False)
    b.config["broker"]["data_dir"] = b.data_dir = os.path.join(str(b.workdir), "data")
    b.start()
    subprocess.run(ADMIN + ["--brokers", url_of(b), "topics", "create", "short", "--partitions", "1",
                            "--retention-hours", "0.0003"], check=True, timeout=60, stdin=subprocess.DEVNULL)
    with RemotingClient(cfg["remoting"]["port"]) as rc:
        for i in range(5):
            assert send_v1(rc, "short", b"old%d" % i).code == C.SUCCESS
        # all five past the retention (on a busy machine the sends may be spread: the first ones expire first)
        wait_for(lambda: pull(rc, "short", 0, 4).code == C.PULL_OFFSET_MOVED, what="short's retention to run")
        moved = pull(rc, "short", 0, 2)
        assert moved.code == C.PULL_OFFSET_MOVED and int(moved.ext_fields["nextBeginOffset"]) == 5
        assert int(moved.ext_fields["minOffset"]) == 5
        assert send_v1(rc, "short", b"young").code == C.SUCCESS
        kept = pull(rc, "short", 0, 5)
        assert [m.body for m in decode_stored_messages(kept.body)] == [b"young"]
