"""An idempotent producer's sequence numbers (metaq.client.producer; docs/spark.md "The idempotent producer")."""


class Sequences:
    """An idempotent producer's sequence numbers of one (topic, partition): the next one, and the oldest unanswered."""

    __slots__ = ("next", "low", "ahead", "waiting")

    def __init__(self):
        self.next = 0
        self.low = 0  # every sequence below it is answered; it is not (unless it is next)
        self.ahead = set()  # sequences above low answered before it (replies out of order)
        self.waiting = False  # a sender waits for room: woken once half the window is free

    def finished(self, seq):
        """``seq`` was answered (again: nothing changes)."""
        if seq != self.low:
            if seq > self.low:
                self.ahead.add(seq)
            return
        low, ahead = seq + 1, self.ahead
        while ahead and low in ahead:
            ahead.discard(low)
            low += 1
        self.low = low

    def finished_run(self, first, count):
        """``first .. first + count - 1`` were answered (an idempotent batch's)."""
        if first != self.low:
            if first > self.low:
                self.ahead.update(range(first, first + count))
            return
        low, ahead = first + count, self.ahead
        while ahead and low in ahead:
            ahead.discard(low)
            low += 1
        self.low = low
