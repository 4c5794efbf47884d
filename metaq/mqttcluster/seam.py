"""The MQTT port's seam as a member of an MQTT cluster answers it (the contract: ``metaq.mqtt.seam.Alone``).

Each of the port's asks goes to the concern that answers it: following and routes (``following.peers.MqttCluster``:
the start hold, the route; its ``following.retained.PeerRetained``: the peers' retained messages), shared groups
(its ``sharing.offer.GroupOffer`` and ``sharing.share.Shares``, and the groups an inbox copy was made for), client
ids and takeover (``clientids.service.ClientIds``). The seam holds the three and nothing else; the broker makes it
from the port (``MqttPort(cluster=...)``, given what the port serves the copies with: ``MqttPort.serve_copies``, which
the following calls from the turn that writes them; and where a retained record may lie in the port's sessions' log,
``RetainedMark.end``, which the peers' follows read the log by) with every part it needs passed in.
"""

from metaq.mqttcluster.following import inbox

__all__ = ["ClusterSeam"]


class ClusterSeam:
    """See the module doc. ``following``: the cluster's ``MqttCluster``; ``client_ids``: its ``ClientIds``;
    ``asks``: what a member may ask (``asks.Asks``, for its counts)."""

    #: the inbox: the peers' copies, read by every subscription and shared group here
    topics = (inbox.INBOX,)

    def __init__(self, following, client_ids, asks, follows=None):
        self.following = following
        self.client_ids = client_ids
        self.asks = asks
        self.follows = follows  # the peers' follows of this broker served from a writing turn (``TurnFollows``)

    def start(self):
        self.client_ids.start()
        self.following.start()

    def stop(self):
        self.following.stop()
        self.client_ids.stop()

    def wait_followed(self):
        self.following.wait_followed()

    def hold(self):
        self.following.hold()

    def join(self, client_id, clean_start, user):
        return self.client_ids.join(client_id, clean_start, user)

    def finished(self, client_id):
        self.client_ids.finished(client_id)

    def released(self, client_id):
        self.client_ids.released(client_id)

    def knows_retained(self, name):
        return self.following.retained.knows(name)

    def local_cleared(self, name, at):
        self.following.retained.local_cleared(name, at)

    def retained_for(self, topic_filter, topics, local):
        return self.following.retained.merged(topic_filter, topics, local)

    def routes_changed(self, topic_filter):
        self.following.routes_changed(topic_filter)

    def groups_changed(self, weights):
        self.following.groups_changed(weights)

    def group_takes(self, key, topic, partition, rec):
        """A copy in the inbox: when the peer it came from assigned it to group ``key`` (``inbox.groups_of``); a
        record of this broker: when the cluster assigns it here (``Shares.takes``, by its place in the log)."""
        if topic == inbox.INBOX:
            return key in inbox.groups_of(rec.flag, rec.data)
        return self.following.shares.takes(key, topic, partition, rec.position)

    def summary_values(self):
        """The client ids', the following's and the asks' pairs, in that order, then the frames sent to the peers'
        follows from a writing turn."""
        turn = [] if self.follows is None else [("mqtt_cluster_sent_from_turn", self.follows.frames)]
        return (self.client_ids.summary_values() + self.following.summary_values() + self.asks.summary_values()
                + turn)

    def serve_follows(self, keys, staged, runs, now, quiet):
        if self.follows is not None:
            self.follows.serve(keys, staged, runs, now, quiet)
