"""The group settings' service: list, show, set and delete a group's settings (protocol-neutral; docs/concepts.md
"Per-group settings").

Front-ends (the text ``group_settings`` command, the HTTP admin routes) call ``GroupAdmin.handle(action, group,
settings)`` after the permission check (a change needs admin, as topic administration does); each returns JSON-able
data and raises ClientError (400: a bad value, the table full), NotFound (404: nothing to delete) or Unavailable
(503: a slave, whose table is its master's). One change at a time; the table's fsync runs in gevent's thread pool
(the event loop goes on); after a change the ``on_change`` callbacks run (the replication master sends the table to
its slaves with the topic table's TOPICS frame).
"""

import gevent
from gevent.lock import Semaphore

from metaq.errors import ClientError, Unavailable
from metaq.groups.table import GroupSettings, check_group


class GroupAdmin:
    def __init__(self, table, refusal=lambda: None):
        """``table``: the store's GroupTable (``MessageStore.groups``); ``refusal()``: why this broker takes no
        change now (a slave), or None."""
        self.table = table
        self.table.run_blocking = _in_thread
        self.refusal = refusal
        self.on_change = []
        self._one = Semaphore()

    def handle(self, action, group, settings):
        if action == "list":
            return self.list()
        if action == "show":
            return self.show(group)
        if action == "set":
            return self.set(group, settings)
        if action == "delete":
            return self.delete(group)
        raise ClientError("unknown group_settings action %r" % (action,))

    def list(self):
        """Every group with settings, by name."""
        return [s.describe() for _n, s in sorted(self.table.entries.items())]

    def show(self, group):
        """``group``'s settings (the defaults, ``"default": true``, when it has no entry)."""
        s = self.table.get(check_group(group))
        return dict((s or GroupSettings(group)).describe(), default=s is None)

    def set(self, group, settings):
        return self._change(lambda: self.table.set(group, dict(settings)).describe())

    def delete(self, group):
        return self._change(lambda: dict(self.table.delete(group).describe(), deleted=True))

    def _change(self, fn):
        why = self.refusal()
        if why is not None:
            raise Unavailable("group settings are changed on the master: %s" % why)
        with self._one:
            result = fn()
        for callback in self.on_change:
            callback()
        return result


def _in_thread(fn):
    return gevent.get_hub().threadpool.apply(fn)
