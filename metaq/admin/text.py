"""The text protocol's admin extensions (``admin/wire.py``): each asks the Guard for ``admin``, calls
``admin.service.AdminOps`` and answers its value as a JSON body."""

import logging
import time

from metaq import errors
from metaq.admin import wire
from metaq.protocol.text import encode_result
from metaq.clock import now_ms

log = logging.getLogger(__name__)


class TextAdmin:
    """``ops``: the AdminOps; ``error_reply(exc, opaque)``: the dispatcher's one error→reply mapping. Each command
    needs the admin permission, declared with it (``admin.wire``) and checked by the dispatcher.
    ``handlers`` maps each admin event type to ``handle(e, conn) -> (reply, 0)``."""

    def __init__(self, ops, error_reply):
        self.ops = ops
        self.error_reply = error_reply
        self.handlers = {
            wire.GroupInfo: self.group_info,
            wire.ResetOffset: self.reset_offset,
            wire.DlqList: self.dlq_list,
            wire.DlqResend: self.dlq_resend,
        }

    def group_info(self, e, conn):
        return _ok(self.ops.group_info(e.group, time.monotonic()), e.opaque), 0

    def reset_offset(self, e, conn):
        value = self.ops.reset_offset(e.group, e.topic, e.partition, e.offset, e.force, now_ms(), time.monotonic())
        return _ok(value, e.opaque), 0

    def dlq_list(self, e, conn):
        return _ok(self.ops.dlq_list(e.group, e.max_count), e.opaque), 0

    def dlq_resend(self, e, conn):
        """Answered from a greenlet of its own: each copy waits until it may be acknowledged."""
        conn.spawn(self._resend, e)
        return None, 0

    def _resend(self, e):
        try:
            return _ok(self.ops.dlq_resend(e.group, e.ids, now_ms()), e.opaque)
        except errors.MetaqError as exc:
            return self.error_reply(exc, e.opaque)
        except Exception as exc:  # noqa: BLE001 - answered (500) and logged, never a silent hang of the client
            log.exception("dlq_resend %s failed", e.group)
            return self.error_reply(errors.BrokerError("dlq_resend failed: %s" % exc), e.opaque)


def _ok(value, opaque):
    return encode_result(200, wire.encode_body(value), opaque)
