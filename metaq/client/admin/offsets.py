"""``metaq-admin reset-offsets``: move a consumer group's committed offsets (docs/operating.md "Admin commands").

``--group G --topic T`` and one of ``--to-earliest``, ``--to-latest``, ``--to-offset N``, ``--to-datetime TIME``
(the first offset stored at or after TIME: ``offset_at``), ``--shift-by N`` (from the committed offset; a
partition without one is left alone); ``--partition P`` for one partition. The new offset is clamped to the
partition's ``[min, max]`` (the table says so). A dry run by default: a table per partition of the current
offset, the new one and the log's bounds; ``--execute`` applies it, refused (exit 3, the live members named)
while the group has live members, unless ``--force``.

Where the offsets live (``--offsets``): ``zk``: MetaQ's layout, ``consumers/<G>/offsets/<T>/<b>-<p>``, live
members the children of ``consumers/<G>/ids``; ``broker``: the brokers' own store (text ``commit_offset`` and
RocketMQ consumers), read with ``group_info`` and written with ``reset_offset``; live members as
``admin/service.py`` defines them. ``auto`` (the default): ZooKeeper when ``--zk`` is given and the group has
offsets there for the topic, else the brokers.
"""

import sys

from metaq import errors
from metaq.admin import wire as adminwire
from metaq.client.admin.tools import EXIT_OK, EXIT_REFUSED, EXIT_USAGE, AdminExit, choose_partition
from metaq.client import replay
from metaq.client.cluster import zk_children, zk_data
from metaq.client.offsets import format_zk_offset, parse_zk_offset
from metaq.client.replies import reply_error

__all__ = ["add_parser", "run", "clamp", "target_offset"]

COLUMNS = ["topic", "partition", "current", "new", "min_offset", "max_offset", "note"]


def add_parser(sub, time_type):
    s = sub.add_parser("reset-offsets", help="move a consumer group's offsets (a dry run unless --execute)")
    s.add_argument("--group", required=True)
    s.add_argument("--topic", required=True)
    to = s.add_mutually_exclusive_group(required=True)
    to.add_argument("--to-earliest", action="store_true", help="each partition's first kept offset")
    to.add_argument("--to-latest", action="store_true", help="each partition's end (skip everything stored)")
    to.add_argument("--to-offset", type=int, metavar="N", help="offset N (clamped to the partition)")
    to.add_argument("--to-datetime", type=time_type, metavar="TIME",
                    help="the first offset stored at or after TIME (ISO 8601, or ms since the Unix epoch)")
    to.add_argument("--shift-by", type=int, metavar="N", help="the committed offset plus N (negative: back)")
    s.add_argument("--partition", metavar="P", help="only this partition (b-p, or a number of the lowest broker)")
    s.add_argument("--offsets", choices=("auto", "zk", "broker"), default="auto",
                   help="where the group's offsets live (default auto: ZooKeeper when --zk is given and the group "
                        "has offsets there for the topic, else the brokers)")
    s.add_argument("--execute", action="store_true", help="apply (without it nothing changes)")
    s.add_argument("--force", action="store_true", help="apply even while the group has live members")


def clamp(offset, low, high):
    """``(offset within [low, high], whether it was moved)``."""
    value = min(max(offset, low), high)
    return value, value != offset


def target_offset(args, current, low, high, offset_at):
    """The wanted offset of one partition (before clamping), or None (``--shift-by`` without a current one)."""
    if args.to_earliest:
        return low
    if args.to_latest:
        return high
    if args.to_offset is not None:
        return args.to_offset
    if args.to_datetime is not None:
        return offset_at(args.to_datetime)
    return None if current is None else current + args.shift_by


class _ZkHome:
    name = "zookeeper"

    def __init__(self, view, group, topic):
        self.zk, self.base = view.cluster.zk, "%s/consumers/%s" % (view.cluster.root, group)
        self.topic = topic

    def has_offsets(self):
        return bool(zk_children(self.zk, "%s/offsets/%s" % (self.base, self.topic)))

    def members(self):
        return ["zookeeper consumer %s" % c for c in sorted(zk_children(self.zk, self.base + "/ids"))]

    def current(self, bid, p):
        raw = zk_data(self.zk, "%s/offsets/%s/%d-%d" % (self.base, self.topic, bid, p))
        try:
            return parse_zk_offset(raw)[0] if raw else None
        except ValueError:
            return None

    def apply(self, bid, p, offset, force):
        path = "%s/offsets/%s/%d-%d" % (self.base, self.topic, bid, p)
        data = format_zk_offset(offset, None).encode("utf-8")
        if self.zk.exists(path):
            self.zk.set(path, data)
        else:
            self.zk.create(path, data, makepath=True)


class _BrokerHome:
    name = "broker"

    def __init__(self, view, group, topic):
        self.view, self.group, self.topic = view, group, topic
        self.infos = {}
        for bid, url in sorted(view.brokers.items()):
            self.infos[bid] = self._call(url, adminwire.GroupInfo(group, 0))

    def _call(self, url, event):
        try:
            reply = self.view.conn(url).call(event, timeout=self.view.timeout)
        except errors.MetaqError as exc:
            raise AdminExit("%s: %s" % (url, exc), 1) from None
        if reply.code != 200:
            error = reply_error(reply)
            hint = " (this needs a user with the admin role)" if reply.code == errors.Forbidden.code else ""
            raise AdminExit("%s refused %s: %s%s" % (url, type(event).__name__, error, hint), EXIT_REFUSED)
        return adminwire.decode_body(reply.body)

    def has_offsets(self):
        return any(o["topic"] == self.topic for info in self.infos.values() for o in info["offsets"])

    def members(self):
        return ["broker %d: %s %s (%s)" % (bid, m["kind"], m["id"], m["address"])
                for bid, info in sorted(self.infos.items()) for m in info["members"]]

    def current(self, bid, p):
        for o in self.infos.get(bid, {}).get("offsets", ()):
            if o["topic"] == self.topic and o["partition"] == p:
                return o["offset"]
        return None

    def apply(self, bid, p, offset, force):
        self._call(self.view.brokers[bid], adminwire.ResetOffset(self.group, self.topic, p, offset, force, 0))


def _home(view, args):
    if args.offsets == "zk" or (args.offsets == "auto" and view.cluster is not None):
        if view.cluster is None:
            raise AdminExit("--offsets zk needs --zk", EXIT_USAGE)
        home = _ZkHome(view, args.group, args.topic)
        if args.offsets == "zk" or home.has_offsets():
            return home
    return _BrokerHome(view, args.group, args.topic)


def run(view, args, render):
    """Print the plan (or what was applied) with ``render(rows, columns)``; returns the exit code."""
    parts = [(bid, p, mn, mx) for bid, topic, p, mn, mx in view.partitions() if topic == args.topic]
    if args.partition is not None:
        wanted = choose_partition(view, args.partition)
        parts = [r for r in parts if (r[0], r[1]) == (wanted.broker_id, wanted.partition)]
    if not parts:
        raise AdminExit("no broker has topic %s%s" % (args.topic, " partition %s" % args.partition
                                                       if args.partition else ""))
    home = _home(view, args)
    members = home.members()
    rows = []
    for bid, p, low, high in sorted(parts):
        current = home.current(bid, p)
        wanted = target_offset(args, current, low, high, lambda ms, bid=bid, p=p: replay.offset_at(
            view.conn(view.brokers[bid]), args.topic, p, ms, view.timeout))
        row = {"topic": args.topic, "partition": "%d-%d" % (bid, p), "current": current, "new": None,
               "min_offset": low, "max_offset": high, "note": "", "store": home.name}
        if wanted is None:
            row["note"] = "no committed offset to shift: left alone"
        else:
            row["new"], clamped = clamp(wanted, low, high)
            if clamped:
                row["note"] = "clamped from %d" % wanted
        rows.append((bid, p, row))
    if all(r["current"] is None for _b, _p, r in rows) and not members:
        raise AdminExit("group %s has no committed offsets for topic %s in %s and no live members (a typo?)"
                        % (args.group, args.topic, home.name))
    if args.execute:
        if members and not args.force:
            raise AdminExit("group %s has live members: %s; stop them first (they would overwrite the reset), or "
                            "add --force" % (args.group, "; ".join(members)))
        for bid, p, row in rows:
            if row["new"] is not None:
                home.apply(bid, p, row["new"], args.force)
    render([r for _b, _p, r in rows], COLUMNS + ["store"])
    if not args.execute:
        note = "dry run: nothing changed; add --execute to apply"
        if members:
            note += " (refused while these members are live, unless --force: %s)" % "; ".join(members)
        print("metaq-admin: %s" % note, file=sys.stderr)
    return EXIT_OK
