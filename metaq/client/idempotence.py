"""An idempotent producer's sequence numbers (metaq.client.producer; docs/spark.md "The idempotent producer"), and
which refusals leave a batch's sequences free (``frees_sequences``, ``gap_expected``)."""

import re

#: The broker's refusal of a ``putb_idem`` whose first sequence of a partition is past the next one it expects
#: (``idempotence.state.Idempotence.check_batch``; docs/text-protocol.md "putb_idem"): the next one in brackets.
_GAP = re.compile(r"^putb_idem: producer \d+'s batch for .+ starts at sequence \d+, past the next one \((\d+)\)")
#: In the broker's refusal of a resend whose content is not the message stored under its sequence (a ``put_idem``'s,
#: a ``putb_idem``'s sub-record): nothing was stored, and the sequence is another message's.
_OTHER_CONTENT = "with other content"


def gap_expected(text):
    """The sequence the broker expects next, read from its ``result 400`` text of a ``putb_idem`` refused as a gap
    (nothing of that batch was stored), or None for any other refusal."""
    m = _GAP.match(text)
    return None if m is None else int(m.group(1))


def other_content(text):
    """True for the broker's refusal of a resend with other content than the message stored under its sequence."""
    return _OTHER_CONTENT in text


def frees_sequences(code, text):
    """True when a batch refused with ``result <code> <text>`` to every attempt stored nothing and holds no
    sequence the broker keeps, so its sequences may be given to the next messages: a 4xx (the broker refuses a
    ``putb_idem`` or ``put_idem`` whole, before storing any of it), but not a resend refused for other content
    (those sequences are stored, with other messages)."""
    return 400 <= code < 500 and not other_content(text)


class Sequences:
    """An idempotent producer's sequence numbers of one (topic, partition): the next one, and the oldest unanswered."""

    __slots__ = ("next", "low", "ahead", "waiting", "top")

    def __init__(self):
        self.next = 0
        self.top = 0  # above every sequence given so far (next, until release or rebase move next back)
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

    def release(self, first, count):
        """The batch holding ``first .. first + count - 1`` failed for good and nothing of it is or will be stored
        (``frees_sequences``): when it is the newest reserved and the only one unanswered, its sequences are given
        to the next messages (True); otherwise they are answered as ``finished_run`` does (False)."""
        if self.low != first or self.next != first + count:
            self.finished_run(first, count)
            return False
        self.top = max(self.top, self.next)
        self.next = first
        self.ahead.clear()
        return True

    def rebase(self, first, count, expected):
        """The batch holding ``first .. first + count - 1`` was refused as a gap, the broker expecting ``expected``
        next (``gap_expected``): give the batch ``expected .. expected + count - 1`` instead and return
        ``expected``; the sequences from ``expected`` up were never stored (batches that failed for good), so
        they are given again. None, changing nothing, unless the batch is the newest reserved and the only one
        unanswered (``low == first``, ``next == first + count``: no other send holds a sequence the move would
        give twice) and ``expected`` is below ``first``."""
        if not 0 <= expected < first or self.low != first or self.next != first + count:
            return None
        self.top = max(self.top, self.next)
        self.next = expected + count
        self.low = expected
        self.ahead.clear()  # only the batch's own sequences could be above low: none was answered
        return expected

    def skip(self, first, count):
        """The batch holding ``first .. first + count - 1`` was refused because the broker holds other messages under
        some of them (``other_content``: a copy of a batch of unknown outcome, stored after this one took its
        sequences again): give the batch the sequences above every one given so far and return its new first.
        Nothing is stored under those, so the broker stores it, or refuses it as a gap naming its next one
        (``rebase``: above what it holds). None, changing nothing, unless the batch is the newest reserved and
        the only one unanswered (as ``rebase``)."""
        if self.low != first or self.next != first + count:
            return None
        top = max(self.top, self.next)
        self.low = top
        self.next = self.top = top + count
        return top
