"""What this broker offers the cluster of its ``$share`` groups: those with members here and their weights, as its
route carries them (service: a change of counts only settles in a greenlet; docs/architecture.md "MQTT across the
cluster").

A group here that gained its first member or lost its last goes at once; a change of counts only, once one moved by
more than MQTT_CLUSTER_SHARE_WEIGHT_STEP_PERCENT (``share.weights_moved``), waits MQTT_CLUSTER_SHARE_SETTLE_S, so
that a burst of members costs one change and members coming and going around a count cost none. At most
MQTT_CLUSTER_MAX_GROUPS go in the route, those with members first (the others' members take what is published here,
as without a cluster).
"""

import logging

import gevent

from metaq.mqttcluster import limits as mqttcluster_limits
from metaq.mqttcluster.sharing.share import weights_moved

log = logging.getLogger(__name__)

__all__ = ["GroupOffer"]


class GroupOffer:
    """See the module doc. ``shares``: the cluster's ``share.Shares`` (told this broker's groups and weights);
    ``applied()``: called once a change is applied (the route's version moves, the links send ROUTES again)."""

    def __init__(self, shares, applied):
        self.shares = shares
        self.applied = applied
        self.groups = ()  # this broker's $share groups with members, as its route carries them
        self.weights = ()  # their weights (members here), one per group, as the route carries them
        self._settling = None  # the greenlet that applies a change of counts only (``changed``)
        self._live = ((), ())  # the groups with members here and their weights, as last told (applied or settling)

    def changed(self, live):
        """This broker's groups with members are ``live`` now ({group: members here}, from ``MqttPort``'s
        ``group_weights``: 0 for a group kept here with no member connected): who takes what of each is decided again
        (``share.Shares``, a broker's share weighted by its members), as the module doc says when."""
        live = dict(live)
        groups = tuple(sorted(live))
        if len(groups) > mqttcluster_limits.MQTT_CLUSTER_MAX_GROUPS:
            log.warning("mqtt cluster: %d shared groups, past MQTT_CLUSTER_MAX_GROUPS (%d): the others are not shared "
                        "across the cluster", len(groups), mqttcluster_limits.MQTT_CLUSTER_MAX_GROUPS)
            groups = tuple(sorted(sorted(live,
                                         key=lambda g: (not live[g], g))[:mqttcluster_limits.MQTT_CLUSTER_MAX_GROUPS]))
        weights = tuple(min(live[g], mqttcluster_limits.MQTT_CLUSTER_SHARE_WEIGHT_MAX) for g in groups)
        if groups != self.groups or [w > 0 for w in weights] != [w > 0 for w in self.weights]:
            self._apply(groups, weights)
        elif weights_moved(self.weights, weights) and self._settling is None:
            self._settling = gevent.spawn_later(mqttcluster_limits.MQTT_CLUSTER_SHARE_SETTLE_S, self._settle)
        self._live = (groups, weights)

    def _settle(self):
        """The counts that changed since a change of counts only, once settled (the groups as they are now)."""
        self._settling = None
        groups, weights = self._live
        if groups != self.groups or weights_moved(self.weights, weights):
            self._apply(groups, weights)

    def _apply(self, groups, weights):
        self.groups, self.weights = groups, weights
        refused = self.shares.refused
        self.shares.set_local(dict(zip(groups, weights, strict=True)))
        if self.shares.refused > refused:
            log.warning("mqtt cluster: %d shared groups tracked is the limit (MQTT_CLUSTER_MAX_GROUPS): some of this "
                        "broker's are not shared across the cluster", self.shares.most)
        self.applied()

    def stop(self):
        if self._settling is not None:
            self._settling.kill(block=False)
