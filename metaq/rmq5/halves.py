"""RocketMQ 5's transactional messages over metaq's transaction service: a transactional SendMessage's half message
(``send_half``), EndTransaction, and the check-back of undecided half messages (a RecoverOrphanedTransactionCommand
on the Telemetry stream of a producer publishing to the topic, ``producers.ProducerStreams``), rounds by
RocketMQ's rules (``transactions.policy.plan_round``).
"""

import hashlib
import logging
from typing import NamedTuple

import gevent

from metaq import errors, limits
from metaq.protocol.message import decode_payload
from metaq.protocol.properties import PROP_KEYS, PROP_TAGS, PROP_UNIQ_KEY, split_attribute
from metaq.rmq5 import messages_pb2 as pb
from metaq.rmq5.calls import client_of, code_of, status
from metaq.rmq5.records import RESERVED_PROPERTIES, Refusal
from metaq.clock import now_ms
from metaq.transactions.policy import GRPC_GROUP_PREFIX, immunity_ms, plan_round
from metaq.transactions.state import HALF_OWNER, half_txid

log = logging.getLogger(__name__)


class Checks(NamedTuple):
    """The check-back of half messages sent over gRPC (the remoting port's settings, ``remoting:``): a round every
    ``interval_s``; a half message is due ``timeout_ms`` after it was stored, asked at most ``check_max`` times,
    then rolled back; at most ``max_half`` pending, ``per_round`` asked a round."""

    interval_s: float
    timeout_ms: int
    check_max: int
    max_half: int
    per_round: int


class Halves:
    """Transactional messages (see the module doc), given what they use: the TxService (None: transactional
    sends refused NOT_IMPLEMENTED), its check-back's ``Checks``, the put path (the caller's publish permission),
    ``endpoint()`` (the store host a checked message names) and the ``producers.ProducerStreams`` asked."""

    def __init__(self, tx, checks, put_path, endpoint, producers):
        self.tx = tx
        self.checks = checks
        self.path = put_path
        self.endpoint = endpoint
        self.producers = producers
        self._check_task = None
        self.counts = {"checks_sent": 0, "checks_unsent": 0, "given_up": 0}

    def rpcs(self):
        """``{rpc: (request type, handler)}``, as ``MessagingService.unary`` holds them."""
        return {"EndTransaction": (pb.EndTransactionRequest, self.end_transaction)}

    def send_half(self, topic, partition, flag, data, sp, now, owner):
        """A transactional message: a half message of metaq's transaction service (journaled, invisible, durable
        before the answer), of group ``%GRPC%<topic>`` (the proxy's group is the topic), ended by EndTransaction or
        by the check-back on a Telemetry stream. Its transaction id, ``<number>:<message id>``, finds it again:
        ``(transaction id, number)``."""
        tx = self.tx
        if tx is None:
            raise Refusal("NOT_IMPLEMENTED", "transactional messages need the broker's transaction service")
        number = tx.next_half_number(now)
        transaction_id = "%d:%s" % (number, sp.message_id)
        if len(transaction_id.encode("utf-8")) > limits.MAX_NAME_BYTES:
            raise Refusal("ILLEGAL_MESSAGE_ID", "a transactional message's id may hold at most %d bytes"
                          % (limits.MAX_NAME_BYTES - len(str(number)) - 1))
        tx.check_quota(owner)
        tx.manager.put_half(number, topic, partition, flag, data, GRPC_GROUP_PREFIX + topic, transaction_id,
                            immunity_ms(None), self.checks.max_half, now, owner)
        try:
            tx.flush_journal()  # in a pool thread: answered once the half message is durable
        except errors.TransactionError:
            tx.rollback_quietly(half_txid(number), HALF_OWNER)
            raise
        return transaction_id, number

    def _half_of(self, topic, transaction_id):
        number, sep, _id = transaction_id.partition(":")
        half = self.tx.manager.half(int(number)) if sep and number.isdigit() and self.tx is not None else None
        if half is None or half.transaction_id != transaction_id or half.group != GRPC_GROUP_PREFIX + topic:
            return None
        return half

    def end_transaction(self, request, call):
        """COMMIT stores the half message in its topic (once), ROLLBACK drops it, UNSPECIFIED leaves it for a
        later end or check; the caller needs publish on the topic. An unknown transaction: the proxy's
        INTERNAL_SERVER_ERROR "cannot found transaction data"."""
        topic = request.topic.name
        if not request.transaction_id.strip():
            raise Refusal("INVALID_TRANSACTION_ID", "a blank transaction id")
        try:
            self.path.check_write(topic, call.session)
        except errors.MetaqError as exc:
            raise Refusal(code_of(exc), str(exc)) from None
        half = self._half_of(topic, request.transaction_id)
        if half is None:
            raise Refusal("INTERNAL_SERVER_ERROR", "cannot found transaction data: no half message of topic %s "
                          "with transaction id %s waits for its end (ended, rolled back after its last check, or "
                          "never sent here)" % (topic[:256], request.transaction_id[:300]))
        try:
            if request.resolution == pb.COMMIT:
                self.tx.commit_now(half_txid(half.number), HALF_OWNER, one_phase=False)
            elif request.resolution == pb.ROLLBACK:
                self.tx.rollback_now(half_txid(half.number), HALF_OWNER)
        except errors.MetaqError as exc:
            raise Refusal(code_of(exc), str(exc)) from None
        return pb.EndTransactionResponse(status=status("OK"))

    def start(self):
        """Start the check-back of gRPC half messages (with a transaction service)."""
        if self.tx is not None and self.checks is not None and self._check_task is None:
            self._check_task = gevent.spawn(self._check_loop)

    def stop(self):
        """Stop the check-back."""
        if self._check_task is not None:
            self._check_task.kill(block=False)
            self._check_task = None

    def _check_loop(self):
        while True:
            gevent.sleep(self.checks.interval_s)
            try:
                self.check_round(now_ms())
            except errors.MetaqError as exc:  # the journal cannot be written: the next round tries again
                log.error("grpc: transaction check-back round stopped: %s", exc)
            except Exception:  # noqa: BLE001 - a round's bug must not end every later round
                log.exception("grpc: transaction check-back round failed; the next round tries again")

    def check_round(self, now):
        """One round over the gRPC half messages (RocketMQ's rules, ``policy.plan_round``): each due one is asked
        about with a RecoverOrphanedTransactionCommand on the Telemetry stream of a producer publishing to its
        topic (with authentication on, one of its sender); none online still counts as a check; past
        ``check_max`` checks it is rolled back."""
        manager, c = self.tx.manager, self.checks
        if manager.replica:
            return None
        plan = plan_round([h for h in manager.halves() if h.group.startswith(GRPC_GROUP_PREFIX)], now,
                          c.timeout_ms, c.check_max, c.per_round)
        for number in plan.give_up:
            self.tx.rollback(half_txid(number), HALF_OWNER)
            self.counts["given_up"] += 1
            log.info("grpc: half message %d rolled back: no answer after %d checks", number, c.check_max)
        for number in plan.check:
            half = manager.half_checked(number, now)
            if self._ask(half):
                self.counts["checks_sent"] += 1
            else:
                self.counts["checks_unsent"] += 1
        if plan.give_up:
            self.tx.flush_journal()
        return plan

    def _ask(self, half):
        for call in self.producers.streams_of(half.topic):
            if half.user is not None and client_of(call).user != half.user:
                continue
            command = pb.TelemetryCommand(recover_orphaned_transaction_command=pb.RecoverOrphanedTransactionCommand(
                message=self._half_message(half, call), transaction_id=half.transaction_id))
            if call.push(command.SerializeToString()):
                return True
        return False

    def _half_message(self, half, call):
        """The half message as a client is given it: its body, tag, keys, id and user properties."""
        attribute, body = decode_payload(half.flag, half.data)
        tags, props, _remoting = split_attribute(attribute)
        sp = pb.SystemProperties(message_id=props.get(PROP_UNIQ_KEY, ""), message_type=pb.TRANSACTION,
                                 body_encoding=pb.IDENTITY, queue_id=half.partition,
                                 body_digest=pb.Digest(type=pb.MD5, checksum=hashlib.md5(body).hexdigest().upper()),
                                 store_host="%s:%d" % self.endpoint())
        tag = tags or props.get(PROP_TAGS)
        if tag:
            sp.tag = tag
        sp.keys.extend(k for k in props.get(PROP_KEYS, "").split(" ") if k)
        sp.born_timestamp.FromMilliseconds(half.stored_ms)
        sp.store_timestamp.FromMilliseconds(half.stored_ms)
        user = {k: v for k, v in props.items() if k not in RESERVED_PROPERTIES and not k.startswith(("@", "__"))}
        return pb.Message(topic=pb.Resource(name=half.topic), user_properties=user, system_properties=sp, body=body)
