"""README "JSON API": an HTTP put "answers once it is durable per the broker's flush and replication modes".
A `sync`-replicated master holds the answer until its slave acknowledges: with the slave SIGSTOPped the message
is in the master's log but the HTTP put is unanswered; continued, it gets 200; left stopped, 503
`FLUSH_SLAVE_TIMEOUT` after `sync_timeout_ms` (the text port's status)."""

import os
import signal
import threading

import pytest

from metaq.client.local import free_port, small_config
from tests.harness.broker import wait_for
from tests.harness.http import request, with_http
from tests.harness.replication import master_config, stats

SYNC_TIMEOUT_MS = 5000  # long enough that the checks made while the put is held never race its timeout


class HeldPut(threading.Thread):
    def __init__(self, broker, body):
        super().__init__(daemon=True)
        self.broker, self.body, self.reply = broker, body, None

    def run(self):
        self.reply = request(self.broker, "POST", "/api/topics/t-sync/messages?partition=0", body=self.body,
                             timeout=60)


@pytest.mark.fault
def test_an_http_put_to_a_sync_master_answers_only_once_the_slave_acknowledges(broker_factory, tmp_path):
    rport = free_port()
    master = broker_factory(with_http(master_config(tmp_path / "m", rport, mode="sync",
                                                    sync_timeout_ms=SYNC_TIMEOUT_MS)), workdir=tmp_path / "m")
    slave = broker_factory(small_config(os.path.join(str(tmp_path / "s"), "data")), workdir=tmp_path / "s",
                           extra_args=["--slave-of", "127.0.0.1:%d" % rport, "--slave-id", "1"])
    wait_for(lambda: stats(master)["replication_slaves"] == "1", 10, "slave connected")
    r = request(master, "POST", "/api/topics/t-sync/messages?partition=0", body=b"acked by both")
    assert r.status == 200 and r.json()["offset"] == 0, r

    for n, (body, let_go) in enumerate(((b"held then acked", True), (b"never acked", False)), 1):
        slave.proc.send_signal(signal.SIGSTOP)  # connected but silent: no ACK comes
        try:
            put = HeldPut(master, body)
            put.start()
            wait_for(lambda n=n: int(stats(master)["total_messages"]) == n + 1, what="the put in the master's log")
            assert put.reply is None and put.is_alive()  # stored, not answered: the slave has not acknowledged
            if let_go:
                slave.proc.send_signal(signal.SIGCONT)
        finally:
            if not let_go:
                put.join(60)
            slave.proc.send_signal(signal.SIGCONT)
        put.join(60)
        if let_go:
            assert put.reply.status == 200 and put.reply.json()["offset"] == n, put.reply
        else:
            assert put.reply.status == 503, put.reply
            assert "FLUSH_SLAVE_TIMEOUT" in put.reply.json()["error"], put.reply
    # the timed-out message is in the master's log all the same, and reaches the slave
    wait_for(lambda: int(stats(slave)["total_messages"]) == 3, what="the slave to copy all three")
