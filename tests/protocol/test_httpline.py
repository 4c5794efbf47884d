"""An HTTP request line recognised among a port's first bytes (metaq.protocol.httpline)."""

from metaq.protocol.httpline import MAX_LOOK_BYTES, http_url, is_http_request, refusal


def test_request_lines_are_recognised():
    for data in (b"GET / HTTP/1.1\r\nHost: x\r\n\r\n", b"HEAD /healthz HTTP/1.0\r\n", b"POST /api/x HTTP/1.1\n",
                 b"PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n", b"OPTIONS * HTTP/1.1\r\n"):
        assert is_http_request(data), data


def test_text_commands_and_partial_lines_are_not():
    for data in (b"get orders g 0 0 1024 1\r\n", b"GET orders\r\n", b"GET / HTTP/1.1", b"version\r\n", b"",
                 b"GET  / HTTP/1.1\r\n", b"get / HTTP/1.1\r\n", b"\x16\x03\x01"):
        assert not is_http_request(data), data
    assert not is_http_request(b"GET /" + b"a" * MAX_LOOK_BYTES + b" HTTP/1.1\r\n")  # past the bytes looked at


def test_the_refusal_is_one_whole_http_response():
    head, _, body = refusal("not here: http://127.0.0.1:8180/").partition(b"\r\n\r\n")
    assert head.split(b"\r\n") == [b"HTTP/1.1 400 Bad Request", b"Content-Type: text/plain; charset=utf-8",
                                   b"Content-Length: %d" % len(body), b"Connection: close"]
    assert body == b"not here: http://127.0.0.1:8180/\n"
    assert http_url("http", "::1", 8180) == "http://[::1]:8180/"
