"""The two-phase-commit coordinator with a real PostgreSQL (and, further down, a real broker).

Crash tests run the coordinator in a child process that stops at a chosen point of the protocol
(after both prepared, after the decision, after the first commit) and is killed with SIGKILL there;
a new Coordinator over fresh connections and the same log then recovers.
"""

import json
import os
import pathlib
import signal
import subprocess
import sys
import time

import psycopg  # the test extra installs it (psycopg[binary])
import pytest

from metaq.client import coordinator as coord_mod
from metaq.client.coordinator import FORMAT_ID, CommitPending, Coordinator, CoordinatorError, DecisionLog, RolledBack
from metaq.transactions.wire import XA_HEURRB

REPO = str(pathlib.Path(__file__).resolve().parents[2])


# -- helpers -------------------------------------------------------------------------------------------

def connect(dsn):
    """A connection as the coordinator wants it: autocommit off and idle."""
    return psycopg.connect(dsn, autocommit=False)


def make_table(dsn, deferred_check=False):
    with psycopg.connect(dsn, autocommit=True) as conn:
        conn.execute("CREATE TABLE orders (id int PRIMARY KEY, item text NOT NULL)")
        if deferred_check:  # a constraint that only fails at PREPARE TRANSACTION
            conn.execute("CREATE TABLE refs (id int PRIMARY KEY, order_id int REFERENCES orders(id) "
                         "DEFERRABLE INITIALLY DEFERRED)")


def rows(dsn, table="orders"):
    with psycopg.connect(dsn, autocommit=True) as conn:
        return conn.execute("SELECT * FROM %s ORDER BY 1" % table).fetchall()


def prepared(dsn):
    """GIDs of the prepared transactions of this DSN's database."""
    with psycopg.connect(dsn, autocommit=True) as conn:
        return sorted(r[0] for r in conn.execute(
            "SELECT gid FROM pg_prepared_xacts WHERE database = current_database()").fetchall())


def insert(conn, oid, item):
    conn.execute("INSERT INTO orders (id, item) VALUES (%s, %s)", (oid, item))


def close_all(*conns):
    for c in conns:
        c.close()


@pytest.fixture
def two_dsns(pg_server, pg_dsn):
    """Two fresh databases on the shared cluster: two independent resource managers."""
    other = pg_server.create_database()
    yield pg_dsn, pg_server.dsn(other)
    pg_server.drop_database(other)


@pytest.fixture
def dbs(two_dsns):
    for dsn in two_dsns:
        make_table(dsn)
    return two_dsns


# -- the crash child -----------------------------------------------------------------------------------

class Pausing:
    """A resource proxy that stops the process at one protocol step (prints PAUSED, then sleeps)."""

    def __init__(self, res, before=None, after=None):
        self._res, self._before, self._after = res, before, after

    def __getattr__(self, name):
        return getattr(self._res, name)

    def _pause(self):
        sys.stdout.write("PAUSED\n")
        sys.stdout.flush()
        time.sleep(3600)

    def tpc_prepare(self):
        if self._before == "tpc_prepare":
            self._pause()
        out = self._res.tpc_prepare()
        if self._after == "tpc_prepare":
            self._pause()
        return out

    def tpc_commit(self, xid=None):
        if self._before == "tpc_commit":
            self._pause()
        return self._res.tpc_commit(xid)


def open_resource(spec):
    """A resource from a JSON-able spec: {"pg": dsn} or {"mq": broker url, "uq": qualifier}."""
    if "pg" in spec:
        return connect(spec["pg"])
    from metaq.client.xa import XAResource

    return XAResource(brokers=[spec["mq"]], unique_qualifier=spec["uq"])


def child_main():
    """argv: log path, JSON {name: spec}, stop point, JSON work. Runs one global transaction."""
    log_path, specs, stop, work = sys.argv[1], json.loads(sys.argv[2]), sys.argv[3], json.loads(sys.argv[4])
    names = list(specs)
    resources = {n: open_resource(s) for n, s in specs.items()}
    if stop == "prepared":      # both prepared, no decision yet
        resources[names[-1]] = Pausing(resources[names[-1]], after="tpc_prepare")
    elif stop == "decided":     # decision on disk, nothing committed
        resources[names[0]] = Pausing(resources[names[0]], before="tpc_commit")
    elif stop == "one_committed":
        resources[names[-1]] = Pausing(resources[names[-1]], before="tpc_commit")
    coord = Coordinator(log_path, resources)
    with coord.transaction() as gtx:
        for name, (kind, arg) in work.items():
            if kind == "sql":
                gtx[name].execute(arg)
            else:
                from metaq.client.message import Message

                gtx[name].send(Message(arg[0], arg[1].encode()))
    print("DONE", flush=True)


CHILD = "import sys; sys.path.insert(0, %r); from tests.client.test_coordinator import child_main; child_main()"


def run_child_until_paused(log_path, specs, stop, work, timeout=60):
    """Start the coordinator child, wait for PAUSED, SIGKILL it; returns its output."""
    cmd = [sys.executable, "-c", CHILD % REPO, str(log_path), json.dumps(specs), stop, json.dumps(work)]
    proc = subprocess.Popen(cmd, cwd=REPO, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        deadline = time.monotonic() + timeout
        line = proc.stdout.readline()
        assert line == "PAUSED\n" and time.monotonic() < deadline, (line, proc.stderr.read())
    finally:
        proc.send_signal(signal.SIGKILL)
        proc.wait(10)
    return line


# -- PostgreSQL + PostgreSQL ---------------------------------------------------------------------------

def test_commit_makes_both_rows_visible(dbs, tmp_path):
    a, b = connect(dbs[0]), connect(dbs[1])
    coord = Coordinator(tmp_path / "coord.log", {"pg1": a, "pg2": b})
    with coord.transaction() as gtx:
        insert(gtx["pg1"], 1, "left")
        insert(b, 1, "right")
        assert coord.is_ours(gtx.gtrid)
    assert gtx.state == "committed"
    assert rows(dbs[0]) == [(1, "left")] and rows(dbs[1]) == [(1, "right")]
    assert prepared(dbs[0]) == prepared(dbs[1]) == []
    assert coord.decisions() == {}
    # the decision went to the log before the commits (one fsynced JSON line)
    [line] = pathlib.Path(coord.log_path).read_text().splitlines()
    assert json.loads(line)["gtrid"] == gtx.gtrid and json.loads(line)["decision"] == "commit"
    # the connections are usable again, also for the next global transaction
    assert coord.run(lambda g: (insert(a, 2, "l2"), insert(b, 2, "r2")) and "ok") == "ok"
    assert len(rows(dbs[0])) == len(rows(dbs[1])) == 2
    close_all(a, b)


def test_a_failing_body_rolls_back_both(dbs, tmp_path):
    a, b = connect(dbs[0]), connect(dbs[1])
    coord = Coordinator(tmp_path / "coord.log", {"pg1": a, "pg2": b})
    with pytest.raises(ZeroDivisionError):
        with coord.transaction() as gtx:
            insert(a, 1, "left")
            insert(b, 1, "right")
            raise ZeroDivisionError("the work inside the transaction failed")
    assert gtx.state == "rolled back"
    assert rows(dbs[0]) == rows(dbs[1]) == []
    # an SQL error inside the body: same, and the connections recover
    with pytest.raises(psycopg.errors.UniqueViolation):
        with coord.transaction():
            insert(a, 5, "x")
            insert(a, 5, "dup")
    with coord.transaction() as gtx:
        insert(a, 5, "x")
        gtx.set_rollback_only()
    assert gtx.state == "rolled back"
    assert rows(dbs[0]) == rows(dbs[1]) == [] and prepared(dbs[0]) == prepared(dbs[1]) == []
    assert not os.path.getsize(coord.log_path)  # nothing was ever decided
    close_all(a, b)


def test_a_failing_prepare_rolls_back_the_prepared_branch(two_dsns, tmp_path):
    make_table(two_dsns[0])
    make_table(two_dsns[1], deferred_check=True)
    a, b = connect(two_dsns[0]), connect(two_dsns[1])
    coord = Coordinator(tmp_path / "coord.log", {"pg1": a, "pg2": b})
    with pytest.raises(RolledBack) as err:
        with coord.transaction():
            insert(a, 1, "left")
            b.execute("INSERT INTO refs VALUES (1, 42)")  # no order 42: fails at PREPARE TRANSACTION
    assert isinstance(err.value.__cause__, psycopg.errors.ForeignKeyViolation)
    assert rows(two_dsns[0]) == rows(two_dsns[1], "refs") == []
    assert prepared(two_dsns[0]) == prepared(two_dsns[1]) == []
    assert coord.decisions() == {}
    close_all(a, b)


def test_begin_refuses_a_connection_inside_a_transaction(dbs, tmp_path):
    a, b = connect(dbs[0]), connect(dbs[1])
    b.execute("SELECT 1")  # psycopg: tpc_begin needs an idle connection
    coord = Coordinator(tmp_path / "coord.log", {"pg1": a, "pg2": b})
    with pytest.raises(RolledBack, match="tpc_begin on pg2"):
        with coord.transaction():
            pytest.fail("the body must not run")
    b.rollback()
    with coord.transaction():
        insert(a, 1, "left")
    assert rows(dbs[0]) == [(1, "left")]
    close_all(a, b)


def pg_specs(dsns):
    return {"pg1": {"pg": dsns[0]}, "pg2": {"pg": dsns[1]}}


WORK = {"pg1": ["sql", "INSERT INTO orders VALUES (1, 'left')"],
        "pg2": ["sql", "INSERT INTO orders VALUES (1, 'right')"]}


def recover_with_fresh_connections(dsns, log_path):
    conns = [connect(d) for d in dsns]
    coord = Coordinator(log_path, {"pg1": conns[0], "pg2": conns[1]})
    try:
        return coord, coord.recover()
    finally:
        close_all(*conns)


@pytest.mark.fault
def test_coordinator_killed_after_both_prepared_recovery_rolls_both_back(dbs, tmp_path):
    log_path = tmp_path / "coord.log"
    run_child_until_paused(log_path, pg_specs(dbs), "prepared", WORK)
    assert len(prepared(dbs[0])) == len(prepared(dbs[1])) == 1  # in doubt on both sides
    assert rows(dbs[0]) == rows(dbs[1]) == []
    coord, report = recover_with_fresh_connections(dbs, log_path)
    assert report.ok and report.committed == []
    assert sorted(n for n, _g in report.rolled_back) == ["pg1", "pg2"]
    assert len({g for _n, g in report.rolled_back}) == 1
    assert prepared(dbs[0]) == prepared(dbs[1]) == [] and rows(dbs[0]) == rows(dbs[1]) == []


@pytest.mark.fault
def test_coordinator_killed_after_the_decision_recovery_commits_both(dbs, tmp_path):
    log_path = tmp_path / "coord.log"
    run_child_until_paused(log_path, pg_specs(dbs), "decided", WORK)
    [gtrid] = DecisionLog(log_path).decisions
    assert len(prepared(dbs[0])) == len(prepared(dbs[1])) == 1 and rows(dbs[0]) == []
    coord, report = recover_with_fresh_connections(dbs, log_path)
    assert report.ok and sorted(report.committed) == [("pg1", gtrid), ("pg2", gtrid)]
    assert report.forgotten == [gtrid] and coord.decisions() == {}
    assert rows(dbs[0]) == [(1, "left")] and rows(dbs[1]) == [(1, "right")]
    assert prepared(dbs[0]) == prepared(dbs[1]) == []
    assert pathlib.Path(log_path).read_text() == ""  # compacted
    _coord, again = recover_with_fresh_connections(dbs, log_path)  # idempotent
    assert again.ok and again.committed == again.rolled_back == again.forgotten == []


@pytest.mark.fault
def test_coordinator_killed_between_the_commits_recovery_commits_the_rest(dbs, tmp_path):
    log_path = tmp_path / "coord.log"
    run_child_until_paused(log_path, pg_specs(dbs), "one_committed", WORK)
    assert rows(dbs[0]) == [(1, "left")] and rows(dbs[1]) == []
    _coord, report = recover_with_fresh_connections(dbs, log_path)
    assert [n for n, _g in report.committed] == ["pg2"] and report.rolled_back == []
    assert rows(dbs[1]) == [(1, "right")] and len(report.forgotten) == 1


def test_recover_touches_only_its_own_branches(pg_server, dbs, tmp_path):
    others = []

    def leave_prepared(dsn, xid_args):
        conn = connect(dsn)
        xid = conn.xid(*xid_args) if isinstance(xid_args, tuple) else xid_args
        conn.tpc_begin(xid)
        conn.execute("SELECT 1")
        conn.tpc_prepare()
        others.append(conn)
        return str(xid)

    gt, mine = "metaq-" + "0" * 32, "metaq-" + "1" * 32
    keep = [leave_prepared(dbs[0], (FORMAT_ID + 1, gt, "pg1")),           # another format id
            leave_prepared(dbs[0], "plain-prepared-transaction"),          # not XA (psycopg: format_id None)
            leave_prepared(dbs[0], (FORMAT_ID, "other-" + "1" * 32, "pg1")),  # another coordinator's
            leave_prepared(dbs[0], (FORMAT_ID, gt, "pg9")),               # another resource's branch
            leave_prepared(dbs[1], (FORMAT_ID, gt, "pg1"))]               # our ids, another database
    gone = leave_prepared(dbs[0], (FORMAT_ID, mine, "pg1"))              # ours, no decision
    a = connect(dbs[0])
    coord = Coordinator(tmp_path / "coord.log", {"pg1": a})
    report = coord.recover()
    assert report.ok and report.rolled_back == [("pg1", mine)] and report.committed == []
    left = [gid for gid, _db in pg_server.prepared_xacts()]
    assert set(keep) <= set(left) and gone not in left
    close_all(a, *others)


def test_recover_keeps_a_decision_while_a_resource_cannot_answer(dbs, tmp_path):
    log_path = tmp_path / "coord.log"
    a, b = connect(dbs[0]), connect(dbs[1])
    gtrid = "metaq-" + "2" * 32
    for conn, name in ((a, "pg1"), (b, "pg2")):
        conn.tpc_begin(conn.xid(FORMAT_ID, gtrid, name))
        insert(conn, 7, name)
        conn.tpc_prepare()
    log = DecisionLog(log_path)
    log.record({"gtrid": gtrid, "decision": "commit", "branches": ["pg1", "pg2"]})
    log.close()
    close_all(a, b)
    a, dead = connect(dbs[0]), connect(dbs[1])
    dead.close()
    coord = Coordinator(log_path, {"pg1": a, "pg2": dead})
    report = coord.recover()
    assert not report.ok and list(report.unreachable) == ["pg2"]
    assert report.committed == [("pg1", gtrid)] and report.kept == [gtrid]
    assert rows(dbs[0]) == [(7, "pg1")] and rows(dbs[1]) == []
    coord.close()
    _coord, report = recover_with_fresh_connections(dbs, log_path)
    assert report.ok and report.committed == [("pg2", gtrid)] and report.forgotten == [gtrid]
    assert rows(dbs[1]) == [(7, "pg2")]
    close_all(a)


class KillBackendBeforeCommit:
    """Proxy of a psycopg connection whose server session is terminated just before its tpc_commit."""

    def __init__(self, conn, pg_server):
        self._conn, self._pg = conn, pg_server

    def __getattr__(self, name):
        return getattr(self._conn, name)

    def tpc_commit(self, xid=None):
        with self._pg.admin() as admin:
            admin.execute("SELECT pg_terminate_backend(%s)", (self._conn.info.backend_pid,))
        return self._conn.tpc_commit(xid)


def test_a_commit_failure_after_the_decision_is_left_to_recovery(dbs, pg_server, tmp_path):
    log_path = tmp_path / "coord.log"
    a, b = connect(dbs[0]), connect(dbs[1])
    coord = Coordinator(log_path, {"pg1": a, "pg2": KillBackendBeforeCommit(b, pg_server)})
    with pytest.raises(CommitPending) as err:
        with coord.transaction() as gtx:
            insert(a, 1, "left")
            insert(b, 1, "right")
    assert list(err.value.failures) == ["pg2"] and gtx.state == "committed"
    assert isinstance(err.value.failures["pg2"], psycopg.OperationalError)
    assert rows(dbs[0]) == [(1, "left")] and rows(dbs[1]) == [] and len(prepared(dbs[1])) == 1
    assert list(coord.decisions()) == [gtx.gtrid]  # kept until recovery finishes it
    coord.close()
    _coord, report = recover_with_fresh_connections(dbs, log_path)
    assert report.ok and report.committed == [("pg2", gtx.gtrid)] and report.forgotten == [gtx.gtrid]
    assert rows(dbs[1]) == [(1, "right")]
    close_all(a, b)


@pytest.mark.fault
def test_a_decision_stays_while_a_recovery_commit_fails(dbs, pg_server, tmp_path):
    log_path = tmp_path / "coord.log"
    run_child_until_paused(log_path, pg_specs(dbs), "decided", WORK)
    a, b = connect(dbs[0]), connect(dbs[1])
    coord = Coordinator(log_path, {"pg1": a, "pg2": KillBackendBeforeCommit(b, pg_server)})
    report = coord.recover()
    [gtrid] = report.kept
    assert report.committed == [("pg1", gtrid)] and [(n, g) for n, g, _e in report.failed] == [("pg2", gtrid)]
    assert report.forgotten == [] and list(coord.decisions()) == [gtrid]
    coord.close()
    _coord, report = recover_with_fresh_connections(dbs, log_path)
    assert report.ok and report.committed == [("pg2", gtrid)] and report.forgotten == [gtrid]
    assert rows(dbs[0]) == [(1, "left")] and rows(dbs[1]) == [(1, "right")]
    close_all(a, b)


# -- the decision log ----------------------------------------------------------------------------------

def test_the_log_drops_a_torn_tail_and_refuses_a_corrupt_middle(tmp_path):
    path = tmp_path / "coord.log"
    log = DecisionLog(path)
    log.record({"gtrid": "metaq-" + "a" * 32, "decision": "commit", "branches": ["x", "y"]})
    log.close()
    with open(path, "ab") as f:
        f.write(b'{"gtrid":"metaq-bbbb","decis')  # a crash in the middle of an append
    log = DecisionLog(path)
    assert list(log.decisions) == ["metaq-" + "a" * 32]
    log.record({"gtrid": "metaq-" + "c" * 32, "decision": "commit", "branches": ["x", "y"]})
    log.close()
    assert len(DecisionLog(path).decisions) == 2
    with open(path, "r+b") as f:
        f.write(b"#")
    with pytest.raises(CoordinatorError, match="corrupt decision at byte 0"):
        DecisionLog(path)


def test_the_log_is_compacted_as_transactions_finish(dbs, tmp_path, monkeypatch):
    monkeypatch.setattr(coord_mod, "COMPACT_EVERY", 8)
    a, b = connect(dbs[0]), connect(dbs[1])
    coord = Coordinator(tmp_path / "coord.log", {"pg1": a, "pg2": b})
    for i in range(30):
        with coord.transaction():
            insert(a, i, "l")
            insert(b, i, "r")
    assert len(rows(dbs[0])) == len(rows(dbs[1])) == 30
    assert len(pathlib.Path(coord.log_path).read_text().splitlines()) < 8
    close_all(a, b)


def test_names_are_checked(tmp_path):
    with pytest.raises(ValueError):
        Coordinator(tmp_path / "c.log", {"bad name": object()})
    with pytest.raises(ValueError):
        Coordinator(tmp_path / "c.log", {"x": object()}, name="x" * 40)
    with pytest.raises(ValueError):
        Coordinator(tmp_path / "c.log", {})


# -- PostgreSQL + the broker (metaq's XAResource) ------------------------------------------------------

TOPIC = "orders"         # "*" in small_config: 2 partitions
QUALIFIER = "coord-test"


def order_messages(broker, topic=TOPIC):
    """Every committed message of ``topic`` on ``broker`` (all partitions), as text, sorted."""
    from metaq.protocol.message import decode_payload
    from tests.harness.broker import consume_all

    with broker.client() as c:
        return sorted(decode_payload(r.flag, r.data)[1].decode() for p in range(2) for r in consume_all(c, topic, p))


def xa_resource(broker):
    from metaq.client.xa import XAResource
    from tests.harness.broker import url_of

    return XAResource(brokers=[url_of(broker)], unique_qualifier=QUALIFIER)


def send(xa, text):
    from metaq.client.message import Message

    return xa.send(Message(TOPIC, text.encode()))


@pytest.fixture
def shop(pg_dsn, broker):
    """(dsn, broker, pg connection, XAResource): a database with ``orders`` and a broker."""
    make_table(pg_dsn)
    db, xa = connect(pg_dsn), xa_resource(broker)
    yield pg_dsn, broker, db, xa
    xa.close()
    db.close()


def test_pg_and_broker_commit_the_row_and_the_messages(shop, tmp_path):
    dsn, broker, db, xa = shop
    coord = Coordinator(tmp_path / "coord.log", {"pg": db, "mq": xa})
    with coord.transaction():
        insert(db, 1, "book")
        send(xa, "order 1 a")
        send(xa, "order 1 b")
        assert order_messages(broker) == []        # not before the commit
    assert rows(dsn) == [(1, "book")]
    assert order_messages(broker) == ["order 1 a", "order 1 b"]
    assert coord.decisions() == {} and xa.tpc_recover() == [] and prepared(dsn) == []


def test_pg_and_broker_roll_back_together(shop, tmp_path):
    dsn, broker, db, xa = shop
    coord = Coordinator(tmp_path / "coord.log", {"pg": db, "mq": xa})
    with pytest.raises(RuntimeError):
        with coord.transaction():
            insert(db, 1, "book")
            send(xa, "order 1")
            raise RuntimeError("after both writes")
    with coord.transaction() as gtx:
        insert(db, 2, "pen")
        send(xa, "order 2")
        gtx.set_rollback_only()
    assert rows(dsn) == [] and order_messages(broker) == []
    with coord.transaction():                      # the resources are usable again
        insert(db, 3, "ink")
        send(xa, "order 3")
    assert rows(dsn) == [(3, "ink")] and order_messages(broker) == ["order 3"]


def test_a_failed_pg_prepare_rolls_back_the_prepared_broker_branch(pg_dsn, broker, tmp_path):
    make_table(pg_dsn, deferred_check=True)
    db, xa = connect(pg_dsn), xa_resource(broker)
    coord = Coordinator(tmp_path / "coord.log", {"mq": xa, "pg": db})  # the broker prepares first
    with pytest.raises(RolledBack, match="tpc_prepare on pg"):
        with coord.transaction():
            send(xa, "order 42")
            db.execute("INSERT INTO refs VALUES (1, 42)")  # fails at PREPARE TRANSACTION
    assert order_messages(broker) == [] and xa.tpc_recover() == [] and prepared(pg_dsn) == []
    xa.close()
    db.close()


def shop_specs(dsn, broker):
    from tests.harness.broker import url_of

    return {"pg": {"pg": dsn}, "mq": {"mq": url_of(broker), "uq": QUALIFIER}}


SHOP_WORK = {"pg": ["sql", "INSERT INTO orders VALUES (1, 'book')"], "mq": ["msg", [TOPIC, "order 1"]]}


def recover_shop(dsn, broker, log_path):
    db, xa = connect(dsn), xa_resource(broker)
    try:
        coord = Coordinator(log_path, {"pg": db, "mq": xa})
        report = coord.recover()
        coord.close()
        return report
    finally:
        xa.close()
        db.close()


def in_doubt(dsn, broker):
    xa = xa_resource(broker)
    try:
        return len(prepared(dsn)), len(xa.tpc_recover())
    finally:
        xa.close()


@pytest.mark.fault
def test_coordinator_killed_after_prepare_recovery_rolls_back_pg_and_broker(shop, tmp_path):
    dsn, broker, _db, _xa = shop
    log_path = tmp_path / "coord.log"
    run_child_until_paused(log_path, shop_specs(dsn, broker), "prepared", SHOP_WORK)
    assert in_doubt(dsn, broker) == (1, 1)
    report = recover_shop(dsn, broker, log_path)
    assert report.ok and sorted(n for n, _g in report.rolled_back) == ["mq", "pg"] and report.committed == []
    assert rows(dsn) == [] and order_messages(broker) == [] and in_doubt(dsn, broker) == (0, 0)


@pytest.mark.fault
def test_coordinator_killed_after_the_decision_recovery_commits_pg_and_broker(shop, tmp_path):
    dsn, broker, _db, _xa = shop
    log_path = tmp_path / "coord.log"
    run_child_until_paused(log_path, shop_specs(dsn, broker), "decided", SHOP_WORK)
    assert in_doubt(dsn, broker) == (1, 1) and order_messages(broker) == []
    report = recover_shop(dsn, broker, log_path)
    assert report.ok and sorted(n for n, _g in report.committed) == ["mq", "pg"] and len(report.forgotten) == 1
    assert rows(dsn) == [(1, "book")] and order_messages(broker) == ["order 1"]
    assert in_doubt(dsn, broker) == (0, 0)
    again = recover_shop(dsn, broker, log_path)    # nothing left, nothing done twice
    assert again.ok and again.committed == again.rolled_back == []
    assert order_messages(broker) == ["order 1"]


@pytest.mark.fault
@pytest.mark.slow
@pytest.mark.parametrize("stop", ["prepared", "decided"])
def test_broker_killed_after_prepare_keeps_the_branch_and_recovery_completes_it(pg_dsn, broker, tmp_path, stop):
    make_table(pg_dsn)
    log_path = tmp_path / "coord.log"
    run_child_until_paused(log_path, shop_specs(pg_dsn, broker), stop, SHOP_WORK)
    broker.kill()                                  # kill -9 with the branch prepared in its journal
    broker.start()
    assert in_doubt(pg_dsn, broker) == (1, 1)     # the prepared branch survived the restart
    report = recover_shop(pg_dsn, broker, log_path)
    assert report.ok
    if stop == "decided":
        assert sorted(n for n, _g in report.committed) == ["mq", "pg"]
        assert rows(pg_dsn) == [(1, "book")] and order_messages(broker) == ["order 1"]
    else:
        assert sorted(n for n, _g in report.rolled_back) == ["mq", "pg"]
        assert rows(pg_dsn) == [] and order_messages(broker) == []
    assert in_doubt(pg_dsn, broker) == (0, 0)
    broker.kill()                                  # and once more: the outcome is final
    broker.start()
    assert order_messages(broker) == (["order 1"] if stop == "decided" else [])


def decide_by_hand(broker, commit):
    """An operator completes the broker's in-doubt branch heuristically (what ``metaq-admin transactions`` sends)."""
    from metaq.protocol import events as ev

    xa = xa_resource(broker)
    [xid] = xa.tpc_recover()
    xa.close()
    kind = "HEURISTIC_COMMIT" if commit else "HEURISTIC_ROLLBACK"
    with broker.client() as c:
        reply = c.call(ev.Transaction(xid.key(QUALIFIER), "operator", kind, c.opaque()))
    assert reply.code == 200, reply


@pytest.mark.fault
@pytest.mark.parametrize("by_hand", ["commit", "rollback"])
def test_recovery_after_an_operator_decided_the_broker_branch(shop, tmp_path, by_hand):
    dsn, broker, _db, _xa = shop
    log_path = tmp_path / "coord.log"
    run_child_until_paused(log_path, shop_specs(dsn, broker), "decided", SHOP_WORK)
    decide_by_hand(broker, by_hand == "commit")
    report = recover_shop(dsn, broker, log_path)
    [gtrid] = {g for _n, g in report.committed}
    assert rows(dsn) == [(1, "book")]
    if by_hand == "commit":   # the same outcome: XA_HEURCOM, forgotten, nothing left
        assert report.ok and sorted(report.committed) == [("mq", gtrid), ("pg", gtrid)]
        assert report.forgotten == [gtrid] and in_doubt(dsn, broker) == (0, 0)
        assert order_messages(broker) == ["order 1"]
    else:                     # the other way: reported (XA_HEURRB) and kept for an operator
        [(name, _g, err)] = report.failed
        assert name == "mq" and err.xa_code == XA_HEURRB and report.kept == [gtrid]
        assert order_messages(broker) == [] and in_doubt(dsn, broker) == (0, 1)


@pytest.mark.slow
def test_a_consumer_never_sees_a_message_whose_row_was_rolled_back(pg_dsn, broker, tmp_path):
    import threading

    make_table(pg_dsn, deferred_check=True)
    db, xa = connect(pg_dsn), xa_resource(broker)
    coord = Coordinator(tmp_path / "coord.log", {"mq": xa, "pg": db})
    seen, stop = set(), threading.Event()

    def consume():
        while not stop.is_set():
            seen.update(order_messages(broker))
            time.sleep(0.01)

    reader = threading.Thread(target=consume)
    reader.start()
    try:
        for i in range(40):
            fate = i % 4       # 0: commit, 1: the body fails, 2: rollback-only, 3: PostgreSQL's prepare fails
            try:
                with coord.transaction() as gtx:
                    insert(db, i, "item %d" % i)
                    send(xa, "order %d" % i)
                    if fate == 1:
                        raise KeyError(i)
                    if fate == 2:
                        gtx.set_rollback_only()
                    if fate == 3:
                        db.execute("INSERT INTO refs VALUES (%s, -1)", (i,))
            except (KeyError, RolledBack):
                assert fate in (1, 3)
    finally:
        stop.set()
        reader.join(30)
    seen.update(order_messages(broker))
    committed = {oid for oid, _item in rows(pg_dsn)}
    assert committed == set(range(0, 40, 4))
    assert seen == {"order %d" % i for i in committed}
    assert xa.tpc_recover() == [] and prepared(pg_dsn) == []
    xa.close()
    db.close()


def test_the_example_commits_rolls_back_and_recovers(pg_dsn, broker, tmp_path):
    from tests.harness.broker import url_of

    def example(*extra):
        cmd = [sys.executable, os.path.join(REPO, "examples", "xa_postgres.py"), "--dsn", pg_dsn,
               "--broker", url_of(broker), "--log", str(tmp_path / "example.log"), *extra]
        return subprocess.run(cmd, capture_output=True, text=True, timeout=120, cwd=str(tmp_path))

    ok = example("--item", "book")
    assert ok.returncode == 0, ok.stdout + ok.stderr
    assert "recover: nothing in doubt" in ok.stdout and "committed order 1" in ok.stdout
    failed = example("--item", "pen", "--fail")
    assert failed.returncode == 2 and "rolled back" in failed.stdout, failed.stdout + failed.stderr
    rec = example("--recover")
    assert rec.returncode == 0 and "nothing in doubt" in rec.stdout, rec.stdout + rec.stderr
    assert rows(pg_dsn) == [(1, "book")]
    assert order_messages(broker) == ['{"order": 1, "item": "book"}']
