"""The proofs of a secret (metaq.auth.proofs): what each binds, and RocketMQ's signature."""

import base64
import hashlib
import hmac

from metaq.auth import proofs


def test_text_proof_binds_side_user_and_both_nonces():
    base = proofs.text_proof(b"k", "client", "alice", "n1", "c1")
    assert base == proofs.text_proof(b"k", "client", "alice", "n1", "c1")
    others = {proofs.text_proof(b"k", "server", "alice", "n1", "c1"),
              proofs.text_proof(b"k", "client", "bob", "n1", "c1"),
              proofs.text_proof(b"k", "client", "alice", "n2", "c1"),
              proofs.text_proof(b"k", "client", "alice", "n1", "c2"),
              proofs.text_proof(b"k2", "client", "alice", "n1", "c1")}
    assert base not in others and len(others) == 5
    assert len(base) == 64 and int(base, 16) >= 0


def test_replication_proof_binds_the_slave_id():
    assert proofs.replication_proof(b"s", "slave", "m", "n", 1) != proofs.replication_proof(b"s", "slave", "m", "n", 2)
    assert proofs.replication_proof(b"s", "slave", "m", "n", 1) != proofs.replication_proof(b"s", "master", "m", "n", 1)


def test_rocketmq_signature_is_hmac_sha1_of_sorted_values_then_body():
    fields = {"topic": "T", "AccessKey": "ak", "b": "2", "Signature": "ignored", "_UNIQUE_KEY_QUERY": "false"}
    # sorted by key: "AccessKey" < "b" < "topic" (uppercase first, as Java's TreeMap of Strings)
    assert proofs.rocketmq_signature(b"sk", fields, b"body") == base64.b64encode(
        hmac.new(b"sk", b"ak2Tbody", hashlib.sha1).digest()).decode()
    assert proofs.rocketmq_signature(b"sk", fields, b"bodx") != proofs.rocketmq_signature(b"sk", fields, b"body")
    assert proofs.rocketmq_signature(b"sk", dict(fields, Signature="other"), b"body") == \
        proofs.rocketmq_signature(b"sk", fields, b"body")


def test_nonces_are_fresh_hex():
    seen = {proofs.new_nonce() for _ in range(1000)}
    assert len(seen) == 1000 and all(len(n) == 2 * proofs.NONCE_BYTES for n in seen)


def test_same_is_exact():
    assert proofs.same("abc", b"abc") and not proofs.same("abc", "abd") and not proofs.same("abc", "abcd")
