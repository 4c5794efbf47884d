"""Transaction ids and XA error bodies (metaq.transactions.wire)."""

import pytest
from hypothesis import given, strategies as st

from metaq.errors import TransactionError
from metaq.transactions import wire


def test_local_and_xa_keys_round_trip():
    assert wire.parse_tx_key("TX:10-0-0-1-1700000000000-1:42") == wire.LocalTxId("10-0-0-1-1700000000000-1", 42)
    x = wire.parse_tx_key("XID:4660:0a0b:ff:XAMessageProducer-host")
    assert x == wire.XaTxId(4660, b"\x0a\x0b", b"\xff", "XAMessageProducer-host")
    assert x.key == "XID:4660:0a0b:ff:XAMessageProducer-host" and x.is_xa
    assert wire.parse_tx_key("XID:0:::q") == wire.XaTxId(0, b"", b"", "q")  # empty branch parts are allowed
    assert wire.parse_tx_key("null") is None


@given(st.integers(-2**31, 2**31 - 1), st.binary(max_size=64), st.binary(max_size=64),
       st.from_regex(r"[A-Za-z0-9_.-]{1,40}", fullmatch=True))
def test_xa_key_property(fmt, gtrid, bqual, qualifier):
    x = wire.XaTxId(fmt, gtrid, bqual, qualifier)
    assert wire.parse_tx_key(x.key) == x


@pytest.mark.parametrize("bad", ["TX:a", "TX::1", "TX:a:b", "TX:a:1:2", "XID:1:aa:bb", "XID:x:aa:bb:q",
                                 "XID:1:AA:bb:q", "XID:1:abc:bb:q", "XID:1:aa:bb:", "XID:1:" + "00" * 65 + ":bb:q",
                                 "tx:a:1", "", "nul"])
def test_bad_keys_are_xaer_inval(bad):
    with pytest.raises(TransactionError) as info:
        wire.parse_tx_key(bad)
    assert info.value.xa_code == wire.XAER_INVAL


def test_error_body_round_trip_and_qualifier_check():
    body = wire.xa_error_body(wire.XAER_NOTA, "unknown branch XID:1:aa:bb:q, msg with, commas")
    assert body.startswith(b"XAException:code=-4,msg=")
    assert wire.parse_xa_error(body) == (-4, "unknown branch XID:1:aa:bb:q, msg with, commas")
    assert wire.parse_xa_error(b"something else") is None
    assert wire.check_qualifier("host-1") == "host-1"
    for bad in ("", "a b", "a:b", "a\tb"):
        with pytest.raises(TransactionError):
            wire.check_qualifier(bad)
