"""The MQTT port's wills (docs/mqtt.md): each published through the put path when its connection ends without a
normal DISCONNECT, kept in the sessions' log until it is published or dropped.

``Wills`` is given what it uses, each a callable or a setting: the put (``MqttPort.put``) and what follows a put
nobody waits for (``made_visible``), the put path's ``check_writable``, the sessions' log's writer, the session
table's wills as they stand (the table is the log's: this only reads it), the guard's ``acting_for``, whether a
connection here holds a client id with a given will, ``session_refusal``, the MQTT cluster's ``wait_followed`` and
the ``mqtt:`` settings (``max_delayed_wills``, ``unconfirmable_grace_s``).

What it holds:

* **the wills held for their delay** (``_delayed``): an MQTT 5 Will Delay holds one for min(Will Delay, Session
  Expiry) unless its client id connects again first with Clean Start 0 (``taken_over``), at most
  ``mqtt.max_delayed_wills`` at once (past it: at once);
* **the log's wills**: each written to the sessions' log (``record_will``) until it is published or dropped
  (``will_done``), so that a master taking over (a promotion, a restart after a kill -9, the end of its own
  fencing) publishes those whose connections ended with the broker that held them (``_adopt_wills``). Each is named
  by its record (``SavedWill.origin``), not by its client id;
* **the pending wills** (``_pending``): those whose publish a passing refusal stopped (``passing``), tried again
  every ``limits.MQTT_WILL_RETRY_S`` (``_retry_wills``) whatever later connections of their client id do; those no
  longer in the log within ``limits.MQTT_MAX_DETACHED_WILLS``;
* **the published wills whose end is not written yet** (``_published``): ended again, never published again;
* **the grace-held wills** (``_moved``): those of the connections this broker closed itself while it could confirm
  no write (``mark_moved``), which wait ``mqtt.unconfirmable_grace_s`` for their clients to come back.
"""

import itertools
import logging
import time

import gevent

from metaq import errors
from metaq.mqtt import limits as mqtt_limits
from metaq.mqtt.follow import SavedWill, encode_will, encode_will_end
from metaq.mqtt.wire import Will
from metaq.serving.connections import share_loop

log = logging.getLogger(__name__)


def passing(exc):
    """True when a will's publish refused with ``exc`` may succeed later, so the will waits (``_retry_wills``)
    rather than being dropped: Unavailable (a full disk, a failed flush, no member to confirm a write), QuotaExceeded
    (``mqtt.max_retained``, a user's or a topic's quota: room comes back as messages go), StoreError (an I/O error
    at the write). A lasting refusal (no permission, a name with no place, a will larger than a segment) drops it."""
    return isinstance(exc, (errors.Unavailable, errors.QuotaExceeded, errors.StoreError))


class Wills:
    """See the module doc."""

    def __init__(self, settings, put, made_visible, check_writable, write, logged_wills, acting_for, holds_will,
                 session_refusal, wait_followed, salt):
        self.settings = settings  # the ``mqtt:`` section
        self.put = put  # ``(topic, payload, qos, client id, properties, security, retain) -> (topic, result, now)``
        self.made_visible = made_visible  # ``(topic, result, now)``: a put nobody waits for
        self.check_writable = check_writable  # raises the put path's refusal to write now
        self.write = write  # ``(client id, data)``: one record written to the sessions' log
        self.logged_wills = logged_wills  # () -> the session table's wills, client id -> SavedWill (read only)
        self.acting_for = acting_for  # ``(user, host)`` -> a guard session
        self.holds_will = holds_will  # ``(client id, origin)`` -> True while a connection here holds that will
        self.session_refusal = session_refusal  # why this broker may keep no session or will now, or None
        self.wait_followed = wait_followed  # in an MQTT cluster, until this broker's peers follow it
        self.salt = salt  # this broker's run's: an origin is unique across its restarts
        self._ids = itertools.count(1)
        self.published_count = 0
        self._delayed = {}  # client id -> (greenlet holding its will for its delay, the will, guard session, origin)
        self._adopting = None  # the greenlet publishing the wills left in the log (``_adopt_wills``)
        #: origin (``SavedWill.origin``) -> ``(client id, Will, guard session)``: wills whose publish a passing refusal
        #: stopped (``publish_will``), tried again every ``limits.MQTT_WILL_RETRY_S`` while this broker keeps sessions
        #: (``_retry_wills``), each until published or refused for good. Keyed by the will, not its client id: a
        #: later connection of the same client id neither ends nor replaces it. Those the log holds are bounded by
        #: the log; those it no longer holds (``_detached``) by ``limits.MQTT_MAX_DETACHED_WILLS``
        self._pending = {}
        #: origin -> client id: wills of the log this broker published but whose end it could not write yet: their
        #: end is written again, they are not published again (``_adopt_wills``, ``_retry_wills``, ``taken_over``)
        self._published = {}
        #: origins of the wills whose connections this broker closed itself while it could confirm no write
        #: (``mark_moved``): not lost clients, so their wills wait ``mqtt.unconfirmable_grace_s`` for them to come
        #: back before they are published (``_adopt_wills``); bounded by the log's wills
        self._moved = set()
        self._last_refusal = None  # the last passing refusal of a will's publish (``_retry_wills``' line)
        self._retried_at = 0.0
        self._adopt_due = False  # this broker began keeping sessions: ``_adopt_wills`` is due (``due``)

    def delayed_count(self):
        """The wills held for their delay now."""
        return len(self._delayed)

    def delayed_security(self, client_id):
        """The guard session of the will of ``client_id`` held for its delay, or None."""
        held = self._delayed.get(client_id)
        return held[2] if held is not None else None

    def taken_over(self, client_id, clean_start, lost):
        """A connection claims ``client_id`` here (``MqttPort.claim``, or one on another broker of the cluster):
        ``lost``, the will of the connection it took over (``Connection.take_over``: ``(will, security, delay,
        origin)`` or None), is published unless the new connection resumes the session before its delay
        (``clean_start`` false); a will held for its delay is published now (``clean_start``: the old session ended)
        or dropped (resumed). A will a passing refusal stopped (``_pending``: its delay ran) is due whatever the new
        connection resumes; one this broker already published is only ended; one whose connection this broker
        closed itself (``_moved``) is dropped: its client came back."""
        if lost is not None:
            will, security, delay, origin = lost
            if clean_start or delay <= 0:
                self.publish_will(client_id, will, security, origin)
        held = self._delayed.pop(client_id, None)
        if held is not None:
            greenlet, will, security, origin = held
            greenlet.kill(block=False)
            if origin in self._moved:
                self.will_done(client_id, origin)
            elif clean_start:
                self.publish_will(client_id, will, security, origin)
        saved = self.logged_wills().get(client_id)
        if saved is None:  # dropped above, or left by the broker that held its connection: as if held here
            return
        if saved.origin in self._published or saved.origin in self._moved:
            self.will_done(client_id, saved.origin)
        elif clean_start or saved.delay_s <= 0 or saved.origin in self._pending:  # no delay: due when its
            self.publish_will(client_id, *self._will_of(saved), saved.origin)  # connection ended, resumed or not
        else:
            self.will_done(client_id, saved.origin)

    def mark_moved(self, origin):
        """This broker closes the connection holding the will ``origin`` itself while it may confirm no write: its
        client was not lost, the will waits for it (``_moved``)."""
        self._moved.add(origin)

    def adopt_next(self):
        """This broker began keeping sessions: the wills left in the log meanwhile are adopted at the next ``due``."""
        self._adopt_due = True

    def stop(self):
        """The broker stops: the pass over the wills ends; the wills it did not publish stay in the log, pending."""
        if self._adopting is not None:
            self._adopting.kill(block=False)

    def publish_held(self):
        """The broker stops: the wills held for their delay are published now (a will's delay does not outlive the
        broker)."""
        held, self._delayed = self._delayed, {}
        for client_id, (greenlet, will, security, origin) in held.items():
            greenlet.kill(block=False)
            self.publish_will(client_id, will, security, origin)

    def record_will(self, client_id, will, security, delay_s):
        """A connection of ``client_id`` holds ``will`` (``security``: its guard session; ``delay_s``: what it
        waits once the connection ends): written to the sessions' log, so that the master that takes over after
        this one publishes it (``_adopt_wills``) if the connection ends with this broker. Returns ``(origin,
        refusal)``: the will's ``SavedWill.origin`` (what the connection names it by), or None with why it was not
        written (None: a broker that keeps no session now writes none: a will on a slave is as its clean session,
        not kept). A will of the same client id still waiting to be published stays pending, outside the log."""
        if self.session_refusal() is not None:
            return None, None
        older = self.logged_wills().get(client_id)
        if older is not None and older.origin in self._pending:
            self._detach(older)
        try:
            self.check_writable()
        except errors.MetaqError as exc:
            return None, str(exc)
        self.write(client_id, encode_will(SavedWill(client_id, security.user, security.host, will.topic,
                                                     will.payload, will.qos, will.retain, dict(will.properties),
                                                     delay_s, origin="%s.%d" % (self.salt, next(self._ids)))))
        saved = self.logged_wills().get(client_id)
        if saved is None or saved is older:
            return None, "its record could not be written to the sessions' log"
        if older is not None:
            self._published.pop(older.origin, None)  # replaced: its end needs no record of its own
        return saved.origin, None

    def _detach(self, saved):
        """``saved`` waits to be published and its client id records a newer will: kept in memory only, within
        ``limits.MQTT_MAX_DETACHED_WILLS`` (past it the oldest is dropped, logged)."""
        detached = [o for o, (c, _, _) in self._pending.items()
                    if self.logged_wills().get(c) is None or self.logged_wills()[c].origin != o]
        for origin in detached[:max(0, len(detached) + 1 - mqtt_limits.MQTT_MAX_DETACHED_WILLS)]:
            client_id, will, _ = self._pending.pop(origin)
            log.warning("mqtt client %s: its will to %s is dropped unpublished: %d wills wait outside the sessions' "
                        "log (MQTT_MAX_DETACHED_WILLS)", client_id, will.topic, mqtt_limits.MQTT_MAX_DETACHED_WILLS)

    def will_done(self, client_id, origin):
        """The will ``origin`` of ``client_id`` was published or dropped: its end written while the log holds it,
        so that no master publishes it again. A later will of the same client id is not ended."""
        self._pending.pop(origin, None)
        self._moved.discard(origin)
        saved = self.logged_wills().get(client_id)
        if saved is not None and saved.origin == origin:
            self.write(client_id, encode_will_end(client_id))
            saved = self.logged_wills().get(client_id)
        if saved is None or saved.origin != origin:
            self._published.pop(origin, None)

    def _will_of(self, saved):
        """``(Will, guard session)`` of a will the log holds: published as its user, from its client's address."""
        return (Will(saved.topic, saved.payload, saved.qos, saved.retain, dict(saved.properties)),
                self.acting_for(saved.user, saved.host))

    def _adopt_wills(self):
        """This broker keeps sessions again (or for the first time): the wills the log holds of connections not held
        here ended with the broker that held them (a killed or deposed master, this one before a kill -9 or while
        it was fenced): each is published now or after its delay, as if its connection had just ended here; one
        whose connection this broker closed itself (``_moved``) after ``mqtt.unconfirmable_grace_s`` at least,
        for its client to come back. In an MQTT cluster, once the peers follow this broker
        (``MqttCluster.wait_followed``)."""
        self.wait_followed()
        turn = time.monotonic()
        for listed in list(self.logged_wills().values()):
            saved = self.logged_wills().get(listed.client_id)  # as it stands now: written again meanwhile, the same
            if saved is None or saved.origin != listed.origin:
                continue
            if self.holds_will(saved.client_id, saved.origin) or saved.origin in self._pending or \
                    saved.client_id in self._delayed:
                continue
            if saved.origin in self._published:  # published here, its end not written yet
                self.will_done(saved.client_id, saved.origin)
                continue
            delay_s = saved.delay_s
            if saved.origin in self._moved:
                delay_s = max(delay_s, self.settings.unconfirmable_grace_s)
            log.info("mqtt client %s: its connection ended with the broker that held it; its will to %s is "
                     "published%s", saved.client_id, saved.topic,
                     " after its delay (%d s)" % delay_s if delay_s > 0 else "")
            self.connection_lost(saved.client_id, *self._will_of(saved), delay_s, saved.origin)
            turn = share_loop(turn)

    def _retry_wills(self):
        """The wills ``publish_will`` could not publish for a passing refusal published now, at once (their delay
        ran already), and the ends this broker could not write after publishing written; one log line per pass."""
        self.wait_followed()
        turn = time.monotonic()
        for origin, client_id in list(self._published.items()):
            self.will_done(client_id, origin)
            turn = share_loop(turn)
        tried, published = len(self._pending), self.published_count
        for origin, (client_id, will, security) in list(self._pending.items()):
            if origin in self._pending:
                self.publish_will(client_id, will, security, origin, quiet=True)
                turn = share_loop(turn)
        if tried:
            log.warning("mqtt: %d wills tried again: %d published, %d still refused for now (%s); tried again every "
                        "%.0f s while this broker may write", tried, self.published_count - published,
                        len(self._pending), self._last_refusal, mqtt_limits.MQTT_WILL_RETRY_S)

    def due(self):
        """While this broker keeps sessions, one pass over the wills at a time (none published twice), the keeper
        going on meanwhile: ``_adopt_wills`` once it begins keeping them (``adopt_next``), else ``_retry_wills``
        every ``limits.MQTT_WILL_RETRY_S`` while a will waits for it."""
        if self._adopting is not None and not self._adopting.dead:
            return
        if self._adopt_due:
            self._adopt_due = False
            self._adopting = gevent.spawn(self._adopt_wills)
        elif (self._pending or self._published) and \
                time.monotonic() - self._retried_at >= mqtt_limits.MQTT_WILL_RETRY_S:
            self._retried_at = time.monotonic()
            self._adopting = gevent.spawn(self._retry_wills)

    def connection_lost(self, client_id, will, security, delay_s, origin=None):
        """A connection with a will ended without a normal DISCONNECT: publish it now, or after ``delay_s``.
        ``origin``: the will's in the log (``record_will``), None when the log does not hold it. One whose connection
        this broker closed itself while it may confirm no write (``_moved``) is left in the log: once it may write,
        ``_adopt_wills`` gives its client ``mqtt.unconfirmable_grace_s`` to come back first."""
        if origin in self._moved and self.session_refusal() is not None:
            return
        if delay_s <= 0 or len(self._delayed) >= self.settings.max_delayed_wills:
            self.publish_will(client_id, will, security, origin)
            return
        old = self._delayed.pop(client_id, None)
        if old is not None:
            old[0].kill(block=False)
        self._delayed[client_id] = (gevent.spawn_later(delay_s, self._delayed_will, client_id, will, security, origin),
                                    will, security, origin)

    def _delayed_will(self, client_id, will, security, origin):
        if self._delayed.pop(client_id, None) is not None:
            self.publish_will(client_id, will, security, origin)

    def publish_will(self, client_id, will, security, origin=None, quiet=False):
        """Store ``will`` as its client's PUBLISH would be (its user's permission asked); a refusal is logged. Then
        its record says it is done (``will_done``: this will's, never a later one of the same client id).
        ``origin``: the will's ``SavedWill.origin`` (None: the log does not hold it, as on a slave); after any
        wait, a will that is neither the log's nor pending any more was published or ended meanwhile: not again.
        While this broker keeps no session (``session_refusal``: a slave, a master that may not acknowledge, a
        ``sync`` one with no member to confirm), a will the log holds is left there: the master that may write next
        publishes it (this one again, ``_adopt_wills``). A passing refusal of the put itself (``passing``) keeps it
        pending, tried again (``_retry_wills``): a will is published once its broker may write, never dropped for
        that. In an MQTT cluster it waits until this broker's peers follow it (``MqttCluster.wait_followed``), so
        that it reaches their subscribers. ``quiet``: a retry pass, which logs one line for all."""
        self.wait_followed()
        saved = self.logged_wills().get(client_id)
        logged = origin is not None and saved is not None and saved.origin == origin
        if origin is not None and not logged and origin not in self._pending:
            return  # published or ended meanwhile
        if origin in self._published:
            self.will_done(client_id, origin)
            return
        refusal = self.session_refusal() if logged or origin in self._pending else None
        if refusal is not None:
            if not quiet:
                log.info("mqtt client %s: its will to %s is left to the master to publish: %s", client_id,
                         will.topic, refusal)
            return
        try:
            topic, r, now = self.put(will.topic, will.payload, will.qos, client_id, will.properties, security,
                                     will.retain)
        except (errors.MetaqError, ValueError) as exc:
            if origin is not None and passing(exc):
                if origin not in self._pending and not logged and \
                        len(self._pending) >= mqtt_limits.MQTT_MAX_DETACHED_WILLS:
                    log.warning("mqtt client %s: its will to %s was not published: %s; %d wills wait already "
                                "(MQTT_MAX_DETACHED_WILLS)", client_id, will.topic, exc, len(self._pending))
                else:
                    self._pending[origin] = (client_id, will, security)
                    self._last_refusal = str(exc)
                    if not quiet:
                        log.warning("mqtt client %s: its will to %s is not published yet: %s; tried again every "
                                    "%.0f s while this broker may write", client_id, will.topic, exc,
                                    mqtt_limits.MQTT_WILL_RETRY_S)
                    return
            else:
                log.warning("mqtt client %s: its will to %s was not published: %s", client_id, will.topic, exc)
        else:
            self.published_count += 1
            self.made_visible(topic, r, now)
            if logged:
                self._published[origin] = client_id  # until its end is written (``will_done``)
        if origin is not None:
            self.will_done(client_id, origin)
