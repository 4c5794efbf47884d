"""A commit's room on disk, checked before its first append (``TransactionManager.apply_commit``).

A full disk met half way through a commit would leave its first messages visible and the rest missing, with other
puts stored in between. So the
commit asks the store first whether every message still to append fits, new segments and index files included
(``MessageStore.check_room``), and is refused whole, nothing stored, when they do not: the branch stays
committing, and a later ``commit`` (once there is room) stores it all.
"""

from metaq.errors import MetaqError, TransactionError
from metaq.protocol.xa import XAER_RMFAIL
from metaq.store.record import record_size


def check_commit_room(store, branch):
    """TransactionError(XAER_RMFAIL) unless ``store`` has room for ``branch``'s messages not yet appended."""
    units, nbytes, largest = {}, 0, 0
    for j, i in enumerate(branch.order):
        if not branch.applied[j]:
            p = branch.puts[i]
            units[(p.topic, p.partition)] = units.get((p.topic, p.partition), 0) + 1
            size = record_size(len(p.topic.encode("utf-8")), len(p.data))
            nbytes, largest = nbytes + size, max(largest, size)
    if not units:
        return
    try:
        store.check_room(nbytes, units, largest)
    except MetaqError as exc:
        raise TransactionError(XAER_RMFAIL, "commit of %s refused before storing any of its %d messages: %s; "
                                            "commit again" % (branch.key, sum(units.values()), exc)) from exc
