"""The proofs of knowing a secret that go on the wire: pure functions, the same on both ends.

* **Text ``auth``** (docs/security.md): the server gives a random nonce; the client answers with its own
  nonce and ``HMAC-SHA256(secret, "metaq-auth-1 client <user> <server nonce> <client nonce>")``; the server
  answers with the same HMAC over ``"... server ..."``, so the client knows the broker holds the secret too.
  Nothing reusable crosses the wire: each proof binds both nonces.
* **Replication** (``protocol.replication`` CHALLENGE and PROOF frames, ``serving.replication.handshake``):
  the same construction with the shared replication secret, the words ``slave`` / ``master`` and the slave id.
* **RocketMQ's ACL signature** (``AclClientRPCHook``): Base64 of ``HMAC-SHA1(secret key, the values of the
  request's extFields sorted by key, the ``Signature`` itself left out, then the body)``.
* **RocketMQ 5's gRPC credentials** (``MQv2-HMAC-SHA1`` in the ``authorization`` header): hex of
  ``HMAC-SHA1(secret key, the x-mq-date-time header)`` (``mqv2_signature``, ``parse_mqv2``; the date a
  signature was made, ``mqv2_date_ms``, so the broker can refuse an old one).

Every comparison is ``hmac.compare_digest``.
"""

import base64
import calendar
import hashlib
import hmac
import os
import re

__all__ = ["new_nonce", "text_proof", "replication_proof", "rocketmq_signature", "mqv2_signature", "parse_mqv2",
           "mqv2_date_ms", "same", "same_secret"]

#: Random bytes in a nonce (hex on the wire: twice as many characters).
NONCE_BYTES = 16
TEXT_SCHEME = "metaq-auth-1"
REPLICATION_SCHEME = "metaq-replication-1"
#: extFields RocketMQ's broker leaves out of the signed content (``PlainAccessValidator``): the signature
#: itself and the unique-key query flag.
UNSIGNED_FIELDS = frozenset({"Signature", "_UNIQUE_KEY_QUERY"})


def new_nonce():
    """A fresh random nonce, as hex text."""
    return os.urandom(NONCE_BYTES).hex()


def _hmac_hex(secret, words):
    return hmac.new(secret, " ".join(words).encode("utf-8"), hashlib.sha256).hexdigest()


def text_proof(secret, side, user, server_nonce, client_nonce):
    """The proof of ``side`` (``"client"`` or ``"server"``) for one text ``auth`` exchange, as hex."""
    return _hmac_hex(secret, (TEXT_SCHEME, side, user, server_nonce, client_nonce))


def replication_proof(secret, side, master_nonce, slave_nonce, slave_id):
    """The proof of ``side`` (``"slave"`` or ``"master"``) for one replication handshake, as hex."""
    return _hmac_hex(secret, (REPLICATION_SCHEME, side, master_nonce, slave_nonce, str(slave_id)))


def rocketmq_signature(secret, ext_fields, body=b""):
    """RocketMQ's ``Signature`` of a request: ``ext_fields`` a dict of str (the Signature key is left out)."""
    content = "".join(str(ext_fields[key]) for key in sorted(ext_fields) if key not in UNSIGNED_FIELDS)
    data = content.encode("utf-8") + (bytes(body) if body else b"")
    return base64.b64encode(hmac.new(secret, data, hashlib.sha1).digest()).decode("ascii")


#: The algorithm RocketMQ 5's clients name first in their ``authorization`` header.
MQV2_ALGORITHM = "MQv2-HMAC-SHA1"


def mqv2_signature(secret, date_time):
    """RocketMQ 5's gRPC signature: lower-case hex of HMAC-SHA1(``secret``, the ``x-mq-date-time`` value)."""
    return hmac.new(secret, date_time.encode("utf-8"), hashlib.sha1).hexdigest()


def parse_mqv2(value):
    """``(access key, signature hex in lower case)`` of an ``authorization`` header ``MQv2-HMAC-SHA1
    Credential=<ak>[/...], SignedHeaders=x-mq-date-time, Signature=<hex>``, as RocketMQ's broker reads it (the
    algorithm up to the first space, then comma-separated ``k=v``, trimmed; the user is ``Credential`` up to its
    first ``/``); ValueError for another algorithm or a part missing."""
    algorithm, _sep, rest = value.strip().partition(" ")
    if algorithm != MQV2_ALGORITHM:
        raise ValueError("not %s" % MQV2_ALGORITHM)
    parts = {}
    for item in rest.split(","):
        key, sep, val = item.strip().partition("=")
        if sep:
            parts[key.strip()] = val.strip()
    credential, signature = parts.get("Credential", ""), parts.get("Signature", "")
    access_key = credential.split("/", 1)[0]
    if not access_key or not signature:
        raise ValueError("no Credential or no Signature")
    return access_key, signature.lower()


_MQV2_DATE = re.compile(r"(\d{4})(\d{2})(\d{2})T(\d{2})(\d{2})(\d{2})Z")


def mqv2_date_ms(value):
    """The ``x-mq-date-time`` a RocketMQ 5 client signs (``yyyyMMdd'T'HHmmss'Z'``, UTC) in ms since the epoch;
    ValueError for another form."""
    m = _MQV2_DATE.fullmatch(value.strip())
    if m is None:
        raise ValueError("not yyyyMMdd'T'HHmmss'Z'")
    year, month, day, hour, minute, second = (int(g) for g in m.groups())
    if not (1 <= month <= 12 and 1 <= day <= calendar.monthrange(year, month)[1] and hour < 24 and minute < 60
            and second < 61):
        raise ValueError("not a date")
    return calendar.timegm((year, month, day, hour, minute, second)) * 1000


def same(a, b):
    """Constant-time equality of two proofs (str or bytes)."""
    if isinstance(a, str):
        a = a.encode("utf-8", "replace")
    if isinstance(b, str):
        b = b.encode("utf-8", "replace")
    return hmac.compare_digest(a, b)


def same_secret(given, secret):
    """Constant-time equality of a secret sent as is (HTTP Basic) with the one on file: their SHA-256 digests are
    compared, so neither the content nor the length of the secret on file shows in the time taken."""
    if isinstance(given, str):
        given = given.encode("utf-8", "replace")
    return hmac.compare_digest(hashlib.sha256(given).digest(), hashlib.sha256(secret).digest())
