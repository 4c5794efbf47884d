"""``Roles.writable`` (stats ``replication_writable``, the ``metaq_replication_writable`` metric, ``metaq-admin
cluster``) says no whenever the put path refuses a put before writing it (``PutPath.writable_refusal``, the one
decision): a full disk and a failed flush too, not only the replication roles. The broker's parts, no network."""

import pytest

from tests.server.test_inprocess import Parts, config


@pytest.fixture
def parts(tmp_path):
    p = Parts(config(tmp_path / "data"))
    p.gate.on_change = p.path.changed
    p.roles.put_refusal = p.path.writable_refusal  # as the broker wires it
    yield p
    p.close()


def test_writable_says_no_on_a_full_disk_and_after_a_failed_flush(parts):
    assert parts.roles.writable() == "yes"
    parts.gate.disk_full("the disk is full (a test)")
    assert parts.roles.writable() == "no (disk full)"
    parts.gate.refresh()
    assert parts.roles.writable() == "yes"
    parts.gate.refresh(flush_failure=OSError(5, "Input/output error"))
    assert parts.roles.writable() == "no (writes refused after a failed flush)"
    stats = dict(parts.roles.stats_values())
    assert stats["replication_writable"] == "no (writes refused after a failed flush)"
