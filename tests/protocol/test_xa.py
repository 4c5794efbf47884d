"""Transaction ids and XA error bodies (metaq.protocol.xa)."""

import pytest
from hypothesis import given, strategies as st

from metaq.errors import TransactionError
from metaq.protocol import xa


def test_local_and_xa_keys_round_trip():
    assert xa.parse_tx_key("TX:10-0-0-1-1700000000000-1:42") == xa.LocalTxId("10-0-0-1-1700000000000-1", 42)
    x = xa.parse_tx_key("XID:4660:0a0b:ff:XAMessageProducer-host")
    assert x == xa.XaTxId(4660, b"\x0a\x0b", b"\xff", "XAMessageProducer-host")
    assert x.key == "XID:4660:0a0b:ff:XAMessageProducer-host" and x.is_xa
    assert xa.parse_tx_key("XID:0:::q") == xa.XaTxId(0, b"", b"", "q")  # empty branch parts are allowed
    assert xa.parse_tx_key("null") is None


@given(st.integers(-2**31, 2**31 - 1), st.binary(max_size=64), st.binary(max_size=64),
       st.from_regex(r"[A-Za-z0-9_.-]{1,40}", fullmatch=True))
def test_xa_key_property(fmt, gtrid, bqual, qualifier):
    x = xa.XaTxId(fmt, gtrid, bqual, qualifier)
    assert xa.parse_tx_key(x.key) == x


@pytest.mark.parametrize("bad", ["TX:a", "TX::1", "TX:a:b", "TX:a:1:2", "XID:1:aa:bb", "XID:x:aa:bb:q",
                                 "XID:1:AA:bb:q", "XID:1:abc:bb:q", "XID:1:aa:bb:", "XID:1:" + "00" * 65 + ":bb:q",
                                 "tx:a:1", "", "nul"])
def test_bad_keys_are_xaer_inval(bad):
    with pytest.raises(TransactionError) as info:
        xa.parse_tx_key(bad)
    assert info.value.xa_code == xa.XAER_INVAL


def test_error_body_round_trip_and_qualifier_check():
    body = xa.xa_error_body(xa.XAER_NOTA, "unknown branch XID:1:aa:bb:q, msg with, commas")
    assert body.startswith(b"XAException:code=-4,msg=")
    assert xa.parse_xa_error(body) == (-4, "unknown branch XID:1:aa:bb:q, msg with, commas")
    assert xa.parse_xa_error(b"something else") is None
    assert xa.check_qualifier("host-1") == "host-1"
    for bad in ("", "a b", "a:b", "a\tb"):
        with pytest.raises(TransactionError):
            xa.check_qualifier(bad)
