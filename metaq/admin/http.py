"""The HTTP port's admin routes: what ``metaq-admin reset-offsets`` and ``dlq`` do, over the same
``admin/service.py`` (docs/operating.md "JSON API and HTTP put/get"). Every route needs the ``admin`` permission.

=========================================================  ======================================================
``GET /api/groups/{group}``                                the group's live members and broker-kept offsets
``POST /api/groups/{group}/offsets/{topic}/{partition}``   reset one offset: ``to=earliest|latest|<offset>``; a
                                                           dry run unless ``execute=1``; refused (409) while the
                                                           group has live members unless ``force=1``
``GET /api/dlq/{group}``                                   the group's dead letters (``max``)
``POST /api/dlq/{group}/resend``                           resend them all, or ``ids=<id or p-o>,...``
``GET /api/topic-table``                                   every topic with its settings and their source
``PUT /api/topics/{topic}``                                create it: ``partitions``, ``perm``, ``ordered``,
                                                           ``retention_hours``, ``retention_bytes``, ``priorities``,
                                                           ``priority_max_wait_ms`` in the query
``PATCH /api/topics/{topic}``                              change those settings
``DELETE /api/topics/{topic}``                             delete it (docs/concepts.md "Topics: the table, ...")
``GET /api/group-settings``                                every group with settings (any user)
``GET /api/group-settings/{group}``                        one group's settings, the defaults if it has none
``PUT /api/group-settings/{group}``                        set some: ``max_retries``, ``consumption_enabled``,
                                                           ``broadcast_allowed``, ``read_from_slave_when_slow`` in
                                                           the query (docs/concepts.md "Per-group settings")
``DELETE /api/group-settings/{group}``                     remove the group's settings
=========================================================  ======================================================

A dry run answers what ``--execute`` would do (the current offset, the new one, the partition's bounds, and
whether the value was clamped into them), exactly as the command line's table; nothing is changed.
"""

import time

from metaq import errors
from metaq.auth.acl import ADMIN
from metaq.clock import now_ms
from metaq.protocol.httpreply import READ, json_response
from metaq.topics.wire import MAX_SETTINGS


def _admin(guard, session, params):
    guard.require(session, ADMIN)


class AdminViews:
    """``admin``: the broker's ``AdminOps``; ``store``: for a partition's bounds; ``topics``: the topic table's
    service (``topics.service.TopicAdmin``); ``groups``: the group settings' (``groups.service.GroupAdmin``)."""

    def __init__(self, admin, store, topics, guard, groups=None):
        self.groups = groups
        self.admin = admin
        self.store = store
        self.topics = topics
        self.guard = guard  # the topic table lists what a user may know (Guard.known_to)

    def group(self, request):
        return json_response(self.admin.group_info(request.params["group"], time.monotonic()))

    def reset(self, request):
        group, topic = request.params["group"], request.params["topic"]
        try:
            partition = int(request.params["partition"])
        except ValueError:
            raise errors.ClientError("partition %r is not a number" % request.params["partition"]) from None
        to = request.arg("to")
        if to is None:
            raise errors.ClientError("say where to: to=earliest, to=latest or to=<offset>")
        self.admin.require_topic(topic)
        low, high = self.store.min_offset(topic, partition), self.store.max_offset(topic, partition)
        if to == "earliest":
            wanted = low
        elif to == "latest":
            wanted = high
        else:
            try:
                wanted = int(to)
            except ValueError:
                raise errors.ClientError("to=%r: expected earliest, latest or an offset" % to) from None
        new = min(max(wanted, low), high)
        plan = {"group": group, "topic": topic, "partition": partition, "min_offset": low, "max_offset": high,
                "current": self.store.query_offset(group, topic, partition), "new": new,
                "clamped_from": wanted if wanted != new else None,
                "live_members": self.admin.live_members(group, time.monotonic())}
        if request.arg("execute", "0") not in ("1", "true"):
            plan["executed"] = False
            return json_response(plan)
        force = request.arg("force", "0") in ("1", "true")
        done = self.admin.reset_offset(group, topic, partition, new, force, now_ms(), time.monotonic())
        plan.update(current=done["old"], executed=True)
        return json_response(plan)

    def dlq(self, request):
        return json_response(self.admin.dlq_list(request.params["group"], request.arg("max", kind=int) or 1000))

    def resend(self, request):
        ids = request.arg("ids")
        wanted = None if ids is None else [i for i in ids.split(",") if i]
        return json_response(self.admin.dlq_resend(request.params["group"], wanted, now_ms()))


    def topic_table(self, request):
        return json_response({"topics": self.topics.list(self.guard.known_to(request.session))})

    def create_topic(self, request):
        return json_response(self.topics.create(request.params["topic"], _settings(request)), status=201)

    def alter_topic(self, request):
        return json_response(self.topics.alter(request.params["topic"], _settings(request)))

    def delete_topic(self, request):
        return json_response(self.topics.delete(request.params["topic"]))

    def group_settings(self, request):
        return json_response({"groups": self.groups.list()})

    def show_group(self, request):
        return json_response(self.groups.show(request.params["group"]))

    def set_group(self, request):
        return json_response(self.groups.set(request.params["group"], _settings(request)))

    def delete_group(self, request):
        return json_response(self.groups.delete(request.params["group"]))


def _settings(request):
    """The topic settings of the query (the store checks names and values; at most MAX_SETTINGS of them)."""
    if len(request.query) > MAX_SETTINGS:
        raise errors.ClientError("at most %d settings, got %d" % (MAX_SETTINGS, len(request.query)))
    return dict(request.query)


def add_admin_routes(router, views):
    router.add("GET", "/api/groups/{group}", _admin, views.group)
    router.add("POST", "/api/groups/{group}/offsets/{topic}/{partition}", _admin, views.reset)
    router.add("GET", "/api/dlq/{group}", _admin, views.dlq)
    router.add("POST", "/api/dlq/{group}/resend", _admin, views.resend)
    router.add("GET", "/api/topic-table", READ, views.topic_table)
    router.add("PUT", "/api/topics/{topic}", _admin, views.create_topic)
    router.add("PATCH", "/api/topics/{topic}", _admin, views.alter_topic)
    router.add("DELETE", "/api/topics/{topic}", _admin, views.delete_topic)
    if views.groups is not None:
        router.add("GET", "/api/group-settings", READ, views.group_settings)
        router.add("GET", "/api/group-settings/{group}", READ, views.show_group)
        router.add("PUT", "/api/group-settings/{group}", _admin, views.set_group)
        router.add("DELETE", "/api/group-settings/{group}", _admin, views.delete_group)
