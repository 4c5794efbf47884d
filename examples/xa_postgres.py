"""One global transaction over PostgreSQL and metaq: a row in ``orders`` and a message, both or neither.

    python examples/xa_postgres.py --dsn "host=127.0.0.1 dbname=shop user=shop" \\
                                   --broker meta://127.0.0.1:8123 --item book
    python examples/xa_postgres.py ... --fail       # the same, then an error: both are rolled back
    python examples/xa_postgres.py ... --recover    # only finish what a crash left in doubt

PostgreSQL needs ``max_prepared_transactions`` > 0 (two-phase commit). The coordinator's decision
log (``--log``) must survive restarts: after a crash, ``--recover`` (or any run, which recovers
first) commits the branches whose COMMIT decision is in the log and rolls back the others, on
both sides. Needs psycopg (``pip install 'psycopg[binary]'``).
"""

import argparse
import json
import sys

import psycopg

from metaq.client.coordinator import CommitPending, Coordinator, RolledBack
from metaq.client.message import Message
from metaq.client import XAResource

COORDINATOR = "xaexample"            # prefix of this program's gtrids: its in-doubt branches
QUALIFIER = "xa-postgres-example"    # the metaq resource's name on the broker (RECOVER lists its branches)


def parse_args(argv=None):
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--dsn", required=True, help="libpq connection string of the database")
    p.add_argument("--broker", required=True, help="meta://host:port of a metaq broker")
    p.add_argument("--topic", default="orders", help="topic of the order messages (default orders)")
    p.add_argument("--item", default="book", help="what the order is for")
    p.add_argument("--log", default="xa_postgres.log", help="the coordinator's decision log")
    p.add_argument("--fail", action="store_true", help="raise inside the transaction: nothing is kept")
    p.add_argument("--recover", action="store_true", help="only resolve in-doubt branches, then exit")
    return p.parse_args(argv)


def ensure_table(dsn):
    with psycopg.connect(dsn, autocommit=True) as conn:
        conn.execute("CREATE TABLE IF NOT EXISTS orders (id serial PRIMARY KEY, item text NOT NULL)")


def print_report(report):
    for what in ("committed", "rolled_back"):
        for resource, gtrid in getattr(report, what):
            print("recover: %s %s on %s" % (what.replace("_", " "), gtrid, resource))
    for resource, gtrid, error in report.failed:
        print("recover: %s on %s still in doubt: %s" % (gtrid, resource, error))
    for resource, error in report.unreachable.items():
        print("recover: %s did not answer: %s" % (resource, error))
    if not (report.committed or report.rolled_back or report.failed or report.unreachable):
        print("recover: nothing in doubt")


def place_order(coord, db, mq, topic, item, fail):
    """The global transaction: INSERT the order, send its message; returns the order id."""
    with coord.transaction() as gtx:
        order_id = db.execute("INSERT INTO orders (item) VALUES (%s) RETURNING id", (item,)).fetchone()[0]
        body = json.dumps({"order": order_id, "item": item}).encode()
        result = mq.send(Message(topic, body))
        print("in %s: inserted order %d, sent %s to %s partition %s"
              % (gtx.gtrid, order_id, body.decode(), topic, result.partition))
        if fail:
            raise RuntimeError("--fail: something went wrong after both writes")
    return order_id


def main(argv=None):
    args = parse_args(argv)
    ensure_table(args.dsn)
    db = psycopg.connect(args.dsn, autocommit=False)
    mq = XAResource(brokers=[args.broker], unique_qualifier=QUALIFIER)
    coord = Coordinator(args.log, {"pg": db, "mq": mq}, name=COORDINATOR)
    try:
        report = coord.recover()
        print_report(report)
        if args.recover:
            return 0 if report.ok else 1
        try:
            order_id = place_order(coord, db, mq, args.topic, args.item, args.fail)
        except CommitPending as exc:
            print("committed, but not everywhere yet (run --recover): %s" % exc)
            return 1
        except (RolledBack, RuntimeError) as exc:
            print("rolled back: %s" % exc)
            return 2
        print("committed order %d: the row and the message are both visible" % order_id)
        return 0
    finally:
        coord.close()
        mq.close()
        db.close()


if __name__ == "__main__":
    sys.exit(main())
