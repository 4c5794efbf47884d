"""The MQTT port's seam with a cluster of brokers: everything the port asks of the cluster, as one interface.

The port is given its seam when it is made (``MqttPort(cluster=...)``: a function of the port, of what the port
serves the cluster's copies with, ``MqttPort.serve_copies``, and of where a retained record may lie in its sessions'
log, ``RetainedMark.end``) and calls it unconditionally; ``Alone`` is
the seam of a broker that is no member of an MQTT cluster (no ZooKeeper, no replication port): it does nothing and
answers as a broker alone would. The cluster's own (``metaq.mqttcluster.seam.ClusterSeam``) has the same methods
(``tests/mqttcluster/test_seam.py`` holds them to it), so the port names no cluster module and has no branch on
whether there is one.
"""

__all__ = ["Alone"]


class Alone:
    """The seam of a broker alone. Each method says what the port asks and what a cluster answers."""

    #: The metaq topics every subscription and shared group reads besides those its filter names: a cluster's inbox
    #: (the peers' copies); none alone.
    topics = ()

    def start(self):
        """The broker starts serving (after the port listens)."""

    def stop(self):
        """The broker stops (before the port stops)."""

    def wait_followed(self):
        """Before a CONNACK and a will: in a cluster, until this broker's peers follow it (its start hold); at once
        alone."""

    def hold(self):
        """This master begins keeping sessions again (the end of a fencing): in a cluster, MQTT traffic waits for the
        peers' follows (``wait_followed``)."""

    def join(self, client_id, clean_start, user):
        """A CONNECT of ``client_id``, before ``claim``: in a cluster, registered with the id's home and its session
        brought from the broker holding it. None to go on, or ``(reason code, why)`` to refuse it."""
        return None

    def finished(self, client_id):
        """A CONNECT of ``client_id`` past ``join`` was claimed or refused here: a takeover elsewhere may go on."""

    def released(self, client_id):
        """Nothing holds ``client_id`` here any more: in a cluster, its home is told (in batches)."""

    def knows_retained(self, name):
        """True when a peer's retained message of topic name ``name`` shows here (its clear must be written)."""
        return False

    def local_cleared(self, name, at):
        """This broker cleared ``name``'s retained message at ``at`` (ms): older ones of the peers no longer show."""

    def retained_for(self, topic_filter, topics, local):
        """The retained messages for a subscription of ``topic_filter`` reading ``topics``: ``local`` (the port's
        own), in a cluster merged with the peers', the newest of each name."""
        return local

    def routes_changed(self, topic_filter):
        """A subscription of ``topic_filter`` was made: in a cluster, the route holds it from now on."""

    def groups_changed(self, weights):
        """The shared groups here are ``weights`` now ({(share name, filter): members here}): in a cluster, the
        route carries them and who takes what is decided again."""

    def group_takes(self, key, topic, partition, rec):
        """True when shared group ``key`` (share name, filter) takes record ``rec`` of ``topic``-``partition`` here
        (its name matched the filter): in a cluster, by the assignment of the broker it was published on; alone,
        always."""
        return True

    def summary_values(self):
        """The ``stats`` summary's pairs of the cluster (none alone)."""
        return []

    def serve_follows(self, keys, staged, runs, now, quiet):
        """A publisher's burst just made visible (``direct.WaitingDeliveries.serve``: ``runs`` over ``staged``,
        written at ``now`` ms): in a cluster, each peer's follow waiting caught up on it is sent it from this turn, its
        wait added to ``quiet`` (``{key: events}``, the waits the append's wake passes over); alone, nothing."""
