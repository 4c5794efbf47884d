"""README "Health and readiness": an `ha: auto` master whose lease ran out (its ZooKeeper gone) answers
`/readyz` 503, refuses puts, and is ready again once ZooKeeper is back."""

from tests.harness.broker import wait_for
from tests.harness.ha import Group, put_until_ok
from tests.harness.http import request, with_http


def test_an_ha_auto_master_whose_lease_ran_out_is_not_ready(broker_factory, tmp_path, own_zk):
    group = Group(broker_factory, tmp_path, own_zk.connect, n=1, mode="async", start=False,
                  max_isolation_ms=0)  # the lease alone (the bound would refuse first: test_isolated_master.py)
    [b] = group.members
    with_http(b.config)
    b.start()
    assert group.master() == 0
    put_until_ok(b, "t-lease", b"while leading")
    wait_for(lambda: request(b, "GET", "/readyz").status == 200, what="the elected master to be ready")
    own_zk.stop()
    wait_for(lambda: request(b, "GET", "/readyz").status == 503,
             what=lambda: "readyz 503 once the lease ran out: %s" % request(b, "GET", "/readyz").text)
    r = request(b, "GET", "/readyz")
    assert r.text.startswith("not ready: writes are refused:") and "lease" in r.text, r
    assert request(b, "GET", "/healthz").status == 200
    with b.client() as c:
        assert c.put("t-lease", b"no lease", 0).code == 503
    own_zk.start()
    wait_for(lambda: request(b, "GET", "/readyz").status == 200, 60,
             what=lambda: "ready again with ZooKeeper back: %s" % request(b, "GET", "/readyz").text)
    put_until_ok(b, "t-lease", b"leading again")
