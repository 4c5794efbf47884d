"""Drives the official RocketMQ 5 Python client (``rocketmq-python-client``) for tests/rmq5/test_official_client.py.

Runs under the client's own virtualenv (never metaq's: the client's import package ``rocketmq`` is the RocketMQ 4
client's too). ``driver.py ENDPOINTS``: reads one JSON command a line on stdin and answers each with one JSON line
on stdout, so a test keeps producers and consumers alive across its steps (a broker restart, a check-back):

* ``{"op": "producer", "name": n, "topics": [t], "checker": {body: "COMMIT"|"ROLLBACK"|"UNKNOWN"}}``
* ``{"op": "send", "producer": n, "messages": [{"topic", "body", "tag", "keys", "group", "delay_s", "props"}],
  "transaction": null|"commit"|"rollback"|"open"}`` -> ``{"receipts": [{"message_id", "transaction_id", ...}]}``
* ``{"op": "checks"}`` -> the checker's calls so far: ``{"checks": [[body, message_id]]}``
* ``{"op": "consumer", "name": n, "group": g, "subscriptions": {topic: [type, expression]}, "await_s": s}``
* ``{"op": "push", "name": n, "group": g, "subscriptions": {...}, "fail": [body], "sleep_s": s}``: a PushConsumer
  whose listener takes ``sleep_s`` a message and fails those bodies' first delivery; ``{"op": "pushed", "name": n}``
  -> ``{"calls": [[body, attempt]], "done": [[body, attempt]]}`` (the calls begun, the calls returned)
* ``{"op": "receive", "consumer": n, "max": k, "invisible_s": s}`` -> ``{"messages": [message]}``
* ``{"op": "ack" | "change", "consumer": n, "ids": [message_id], "invisible_s": s}`` (the last message received
  with that id)
* ``{"op": "shutdown", "name": n}``, ``{"op": "quit"}``
* ``{"op": "shutdown_receiving", "name": n, "after_s": s}``: shut consumer ``n`` down ``after_s`` into a receive
  (long-polling) begun meanwhile -> ``{"receive": "<what it returned or raised>"}``

A command that raises answers ``{"error": "<exception class>: <text>"}``."""

import json
import sys
import threading
import time

from rocketmq import (ClientConfiguration, ConsumeResult, Credentials, FilterExpression, Message, MessageListener,
                      Producer, PushConsumer, SimpleConsumer, TransactionChecker, TransactionResolution)
from rocketmq.grpc_protocol import FilterType


class Checker(TransactionChecker):
    """Answers the broker's check-back from the resolutions the test gave, by body; records each call."""

    def __init__(self, resolutions):
        self.resolutions = resolutions
        self.calls = []
        self.lock = threading.Lock()

    def check(self, message):
        body = message.body.decode()
        with self.lock:
            self.calls.append([body, message.message_id])
        return getattr(TransactionResolution, self.resolutions.get(body, "UNKNOWN"), 0)


class Listener(MessageListener):
    """A push consumer's listener: records ``[body, attempt]`` of each call as it begins and as it returns; takes
    ``sleep_s`` a message; fails a body of ``fail`` on its first delivery (the client then asks for it again)."""

    def __init__(self, fail, sleep_s=0):
        self.fail = set(fail)
        self.sleep_s = sleep_s
        self.calls = []
        self.done = []
        self.lock = threading.Lock()

    def consume(self, message):
        body = message.body.decode()
        with self.lock:
            self.calls.append([body, message.delivery_attempt])
        time.sleep(self.sleep_s)
        with self.lock:
            self.done.append([body, message.delivery_attempt])
        if body in self.fail and message.delivery_attempt == 1:
            return ConsumeResult.FAILURE
        return ConsumeResult.SUCCESS


def message_of(spec):
    m = Message()
    m.topic = spec["topic"]
    m.body = spec["body"].encode()
    if spec.get("tag"):
        m.tag = spec["tag"]
    for key in spec.get("keys") or ():
        m.keys = key  # the setter adds one key a call
    if spec.get("group"):
        m.message_group = spec["group"]
    if spec.get("delay_s"):
        m.delivery_timestamp = int(time.time()) + spec["delay_s"]  # the client's unit: seconds since the epoch
    for k, v in (spec.get("props") or {}).items():
        m.add_property(k, v)
    return m


def described(m):
    return {"body": m.body.decode(errors="replace"), "topic": m.topic, "tag": m.tag, "keys": sorted(m.keys),
            "props": dict(m.properties), "message_id": m.message_id, "group": m.message_group,
            "attempt": m.delivery_attempt, "delivery_timestamp": m.delivery_timestamp, "corrupted": m.corrupted}


class Driver:
    def __init__(self, endpoints):
        self.config = ClientConfiguration(endpoints, Credentials(), request_timeout=5)
        self.clients = {}
        self.checker = Checker({})
        self.received = {}  # message id -> the last Message received with it
        self.listeners = {}  # push consumer name -> its Listener

    def producer(self, name, topics, checker=None):
        self.checker.resolutions.update(checker or {})
        p = Producer(self.config, topics, checker=self.checker)
        p.startup()
        self.clients[name] = p
        return {}

    def send(self, producer, messages, transaction=None):
        p = self.clients[producer]
        receipts = []
        for spec in messages:
            m = message_of(spec)
            if transaction:
                tx = p.begin_transaction()
                r = p.send(m, tx)
                if transaction == "commit":
                    tx.commit()
                elif transaction == "rollback":
                    tx.rollback()
            else:
                r = p.send(m)
            receipts.append({"message_id": r.message_id, "transaction_id": r.transaction_id,
                             "offset": r.offset,
                             "recall_handle": r.recall_handle})
        return {"receipts": receipts}

    def checks(self):
        with self.checker.lock:
            return {"checks": list(self.checker.calls)}

    def consumer(self, name, group, subscriptions, await_s=1):
        subs = {t: FilterExpression(e, FilterType.SQL if kind == "SQL92" else FilterType.TAG)
                for t, (kind, e) in subscriptions.items()}
        c = SimpleConsumer(self.config, group, subs, await_duration=await_s)
        c.startup()
        self.clients[name] = c
        return {}

    def push(self, name, group, subscriptions, fail=(), sleep_s=0):
        subs = {t: FilterExpression(e, FilterType.SQL if kind == "SQL92" else FilterType.TAG)
                for t, (kind, e) in subscriptions.items()}
        listener = Listener(fail, sleep_s)
        c = PushConsumer(self.config, group, listener, subs)
        c.startup()
        self.clients[name] = c
        self.listeners[name] = listener
        return {}

    def pushed(self, name):
        listener = self.listeners[name]
        with listener.lock:
            return {"calls": list(listener.calls), "done": list(listener.done)}

    def receive(self, consumer, max=16, invisible_s=10):
        got = self.clients[consumer].receive(max, invisible_s)
        for m in got:
            self.received[m.message_id] = m
        return {"messages": [described(m) for m in got]}

    def ack(self, consumer, ids):
        for i in ids:
            self.clients[consumer].ack(self.received[i])
        return {}

    def change(self, consumer, ids, invisible_s):
        for i in ids:
            self.clients[consumer].change_invisible_duration(self.received[i], invisible_s)
        return {}

    def shutdown(self, name):
        self.clients.pop(name).shutdown()
        return {}

    def shutdown_receiving(self, name, after_s):
        consumer, outcome = self.clients[name], {}

        def receive():
            try:
                outcome["receive"] = "%d messages" % len(consumer.receive(16, 10))
            except Exception as e:  # noqa: BLE001 - what the client raised is the answer
                outcome["receive"] = "%s: %s" % (type(e).__name__, e)

        thread = threading.Thread(target=receive, daemon=True)
        thread.start()
        time.sleep(after_s)
        self.shutdown(name)
        thread.join(30)
        return outcome


def main():
    driver = Driver(sys.argv[1])
    for line in sys.stdin:
        command = json.loads(line)
        op = command.pop("op")
        if op == "quit":
            break
        try:
            answer = getattr(driver, op)(**command)
        except Exception as e:  # the test reads what the client raised
            answer = {"error": "%s: %s" % (type(e).__name__, e)}
        sys.stdout.write(json.dumps(answer) + "\n")
        sys.stdout.flush()
    for c in list(driver.clients.values()):
        try:
            c.shutdown()
        except Exception:
            pass


if __name__ == "__main__":
    main()
