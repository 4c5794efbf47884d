"""The unit tier's guard (tests/conftest.py): a unit test cannot open a network socket, an integration test can."""

import socket

import pytest


def test_a_unit_test_cannot_bind_a_tcp_socket():
    with socket.socket() as s, pytest.raises(AssertionError, match="unit test may not bind"):
        s.bind(("127.0.0.1", 0))


def test_a_unit_test_cannot_connect_through_gevent():
    gsocket = pytest.importorskip("gevent.socket")
    with pytest.raises(AssertionError, match="unit test may not connect"):
        gsocket.create_connection(("127.0.0.1", 9), timeout=1)


def test_a_unit_test_cannot_send_a_datagram():
    with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as s, pytest.raises(AssertionError, match="sendto"):
        s.sendto(b"x", ("127.0.0.1", 9))


def test_a_unit_test_may_use_unix_sockets(tmp_path):
    a, b = socket.socketpair()
    with a, b:
        a.sendall(b"x")
        assert b.recv(1) == b"x"
    with socket.socket(socket.AF_UNIX) as s:
        s.bind(str(tmp_path / "sock"))


def test_the_marker_is_set_from_the_fixtures(request, broker_factory):
    assert request.node.get_closest_marker("integration") is not None


@pytest.mark.integration
def test_an_integration_test_may_listen():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        s.listen(1)
