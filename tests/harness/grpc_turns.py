"""The same gRPC calls against two fresh brokers, one answering on the connection's reader (authentication off) and
one from a greenlet a call (authentication on, alice's credentials): what the tests of where a call is answered
compare."""

from metaq.client.local import BrokerProcess, free_port, small_config
from tests.harness.acl import SECRETS, write_acl


def grpc_broker(wd, **sections):
    """A started broker with a gRPC port and ``flush: async`` (nothing a call waits for), in ``wd``."""
    wd.mkdir(parents=True, exist_ok=True)
    cfg = small_config(wd / "data", grpc={"port": free_port()}, store={"flush": "async", "flush_interval_ms": 20},
                       **sections)
    return BrokerProcess(wd, cfg).start()


def inline_and_spawned(tmp_path, calls, client_id, credentials):
    """``(inline, spawned)``: what ``calls(port, metadata)`` returned against a broker without authentication
    (``client_id`` its only metadata) and against one with it (``credentials("alice", secret)`` signing)."""
    plain = grpc_broker(tmp_path / "plain")
    try:
        inline = calls(plain.config["grpc"]["port"], (("x-mq-client-id", client_id),))
    finally:
        plain.kill()
    secured = grpc_broker(tmp_path / "secured", security={"acl_file": write_acl(tmp_path / "acl.yaml")})
    try:
        spawned = calls(secured.config["grpc"]["port"], tuple(credentials("alice", SECRETS["alice"])))
    finally:
        secured.kill()
    return inline, spawned
