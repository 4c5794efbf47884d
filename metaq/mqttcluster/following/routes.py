"""A broker's route: the one set of MQTT filters its sessions hold, sent to every peer (pure).

Sessions' filters are aggregated: each filter once, whatever the number of sessions holding it (a million devices
subscribed to ``devices/<id>/cmd`` hold a million filters, a fleet subscribed to ``alerts/#`` one). Past ``most``
(MQTT_CLUSTER_MAX_FILTERS) the route names whole metaq topics instead: ``<first level>/#`` (which matches the
level itself too) for each filter's literal first level, or ``#`` once any filter begins with a wildcard. A peer
then sends more than is wanted; the subscriber's broker filters each message as ever; nothing is missed.
"""

from metaq.mqttcluster import limits as mqttcluster_limits

__all__ = ["aggregate"]


def aggregate(filters, most=None):
    """The route (a sorted tuple of filters) of the filters ``filters`` (any iterable, repeats allowed), at most
    ``most`` of them (None: MQTT_CLUSTER_MAX_FILTERS)."""
    if most is None:
        most = mqttcluster_limits.MQTT_CLUSTER_MAX_FILTERS
    unique = set(filters)
    if len(unique) <= most:
        return tuple(sorted(unique))
    firsts = set()
    for f in unique:
        first = f.split("/", 1)[0]
        if first in ("+", "#"):
            return ("#",)
        firsts.add(first)
    out = set()
    for first in firsts:
        out.add(first + "/#")
    if len(out) > most:
        return ("#",)
    return tuple(sorted(out))
