"""A replication frame is written whole: in one write up to ``SEND_JOINED_BYTES`` (one segment on a TCP_NODELAY
link), part by part past it; the bytes are the frame's either way."""

from metaq.protocol import replication as rp
from metaq.serving.replication.link import SEND_JOINED_BYTES, send_event


class Writes:
    """A socket that takes at most ``most`` bytes a ``send`` (its buffer full past them), all of a ``sendall``."""

    def __init__(self, most=1 << 30):
        self.writes, self.most = [], most

    def send(self, data):
        self.writes.append(bytes(data[:self.most]))
        return len(self.writes[-1])

    def sendall(self, data):
        self.writes.append(bytes(data))


def _data_of(total):
    """A DATA frame of ``total`` bytes in all."""
    head = len(rp.serialize(rp.Data(7, b"")))
    return rp.Data(7, memoryview(b"x" * (total - head)))


def test_a_frame_at_the_bound_goes_in_one_write_and_one_past_it_part_by_part():
    for total, writes in ((SEND_JOINED_BYTES, 1), (SEND_JOINED_BYTES + 1, 3)):
        event = _data_of(total)
        sock = Writes()
        send_event(sock, event)
        assert len(sock.writes) == writes
        assert b"".join(sock.writes) == rp.serialize(event)
        assert sum(map(len, sock.writes)) == total


def test_small_frames_of_every_kind_a_peer_link_sends_go_in_one_write():
    for event in (rp.PeerCall(3, b'{"op":"register","c":"d1"}'), rp.PeerReply(b'{"a":[]}'), rp.Records(()),
                  rp.ErrorFrame(409, "refused"), rp.Heartbeat(1, 2, 3)):
        sock = Writes()
        send_event(sock, event)
        assert sock.writes == [rp.serialize(event)]


def test_a_frame_the_socket_takes_in_part_is_written_whole():
    event = rp.PeerReply(b'{"a":[' + b'{"gen":1},' * 300 + b'{"gen":2}]}')
    sock = Writes(most=1000)
    send_event(sock, event)
    assert len(sock.writes) == 2 and b"".join(sock.writes) == rp.serialize(event)
