"""DESIGN §2: imports go one way, no import cycles, no private names taken across modules; the structure rules.

Walk every module of metaq/ with ast and fail on a forbidden import (by layer; a feature package's module by its
role's layer, and on a feature module whose name is no role), on a strongly connected component of more than one
module in the import graph (deferred imports counted), on an arrow between folders that points up unnamed (UPWARD)
and on more such arrows, or pairs of folders importing each other, than their bounds, on another module's private
name (``from x import _y``, ``module._y``, ``obj._y`` where obj is not self/cls), on a class split into mixins,
on a private re-exported under a public name, on a constructor parameter named after a front-end or the broker,
and on a module over LONG_MODULE_LINES lines whose docstring does not say why.
"""

import ast
import functools
import pathlib
import sys

import pytest

ROOT = pathlib.Path(__file__).resolve().parent.parent / "metaq"

IO_MODULES = {"socket", "socketserver", "select", "selectors", "asyncio", "ssl", "gevent", "kazoo", "threading",
              "_thread", "signal", "multiprocessing", "subprocess", "concurrent"}

# layer -> (metaq packages it may import, other top-level modules it must not import)
RULES = {
    "errors": ({"metaq.errors"}, IO_MODULES | {"logging", "time"}),
    "limits": ({"metaq.errors", "metaq.limits"}, IO_MODULES | {"logging", "time"}),
    "protocol": ({"metaq.errors", "metaq.limits", "metaq.protocol"}, IO_MODULES | {"logging", "time"}),
    # Users, permissions and proofs of a secret (hmac, ipaddress): pure, like protocol.
    "auth": ({"metaq.errors", "metaq.limits", "metaq.auth"}, IO_MODULES | {"logging", "time"}),
    "store": ({"metaq.errors", "metaq.limits", "metaq.protocol", "metaq.store"}, IO_MODULES | {"time", "datetime"}),
    "server": ({"metaq", "metaq.errors", "metaq.limits", "metaq.clock", "metaq.protocol", "metaq.auth",
                "metaq.store", "metaq.loop", "metaq.serving", "metaq.server"}, set()),
    # The server's parts the features' services and handlers use (the put path, connections, long polls, the
    # replication link's framing and handshake): below the server, which assembles them with the features, and
    # importing no feature.
    "serving": ({"metaq", "metaq.errors", "metaq.limits", "metaq.clock", "metaq.protocol", "metaq.auth",
                 "metaq.store", "metaq.loop", "metaq.serving"}, set()),
    # What the front-ends' handlers share of the event loop (cold pages, inflated bodies, a get's expect): gevent,
    # below the server and the features' services and handlers, importing neither.
    "loop": ({"metaq", "metaq.errors", "metaq.limits", "metaq.protocol", "metaq.loop"}, set()),
    # The client talks to ZooKeeper through kazoo (its threading handler), never through gevent.
    "client": ({"metaq", "metaq.errors", "metaq.limits", "metaq.protocol", "metaq.auth", "metaq.client"}, {"gevent"}),
    "spark": ({"metaq", "metaq.errors", "metaq.limits", "metaq.protocol", "metaq.auth", "metaq.client", "metaq.spark"},
              {"gevent"}),
    # Driven by fabfile.py over SSH: builds the bundle and the remote commands here, and runs on the hosts
    # as the agent (start/stop/status of the broker process, a probe over the text protocol). It reads the
    # server's config schema to validate an inventory, never the server itself; SSH stays in fabfile.py.
    # The agent's probe authenticates with the client's credentials (client/security.py: stdlib, auth, protocol).
    "deploy": ({"metaq", "metaq.errors", "metaq.limits", "metaq.protocol", "metaq.auth", "metaq.server.config",
                "metaq.client.security", "metaq.deploy"},
               {"gevent", "kazoo", "fabric", "paramiko", "invoke"}),
    # metaq/__init__.py and the C helper's loader: stdlib only.
    "root": ({"metaq"}, IO_MODULES),
    "speedups": ({"metaq"}, IO_MODULES),
    # The native layer's finder of compiled modules: stdlib only.
    "native": ({"metaq"}, IO_MODULES),
    # The broker's wall clock: time and the C helper's loader; the server and the features' services read it.
    "clock": ({"metaq"}, IO_MODULES),
}


# -- feature packages -----------------------------------------------------------------------------------------
#
# A feature package (metaq/timers/) holds every module of one feature, each named by its role; the role says the
# layer whose rules the module gets. A feature module imports what its layer may, and of its own feature only the
# modules whose role's layer its layer may import (records never imports service). A layer imports a feature's
# module as it would a module of that module's role's layer (protocol may import metaq.timers.records, never
# metaq.timers.index; the server anything but the client's). A feature module whose name is not a known role has
# no layer, and fails.

#: The feature packages: metaq/<name>/, flat, a module per role.
FEATURES = {"timers", "topics", "offsets", "keys", "idempotence", "transactions", "priorities", "reqreply",
            "admin", "filters", "mqtt", "rmq5", "pop", "trace", "groups", "mqttcluster"}

#: A feature package's sub-packages, one level down, each its modules of one concern (each module named by its role,
#: as in a flat package): the MQTT cluster's as EMQX splits its router, its broker dispatch and its connection manager.
FEATURE_PARTS = {"mqttcluster": {"following", "sharing", "clientids"}}

#: A feature module's name -> its role.
FEATURE_ROLES = {
    "records": "codec", "wire": "codec", "burst": "codec",  # bytes in, values out
    "window": "logic",  # pure decisions, the time passed in
    "index": "state", "handoff": "state",  # files and in-memory state: no socket, gevent or clock
    "service": "service",  # the gevent service
    "text": "front-end", "fasttext": "front-end", "http": "front-end",  # a front-end's handlers
    "names": "logic",  # a feature's naming rules (which names are the broker's own)
    "table": "state", "state": "state", "retention": "state",  # a persistent table, the store's state, retention
    "files": "state",  # a feature's own data files
    "remoting": "front-end",  # RocketMQ remoting's handlers
    "policy": "logic",  # a feature's pure rules (which are due, which are given up)
    "lag": "logic",  # a consumer group's position and lag, of every protocol (pure)
    "journal": "state", "config": "state",  # a journal's files; a feature's settings
    "levels": "codec",  # a fixed set of choices and their records (the delay levels)
    "scheduler": "service",  # a gevent service that runs due work
    "reads": "state",  # store-level reads over the log and its index (no socket, gevent or clock)
    "follow": "state",  # a subscriber of the store's log follower (store/follower.py)
    "topics": "logic",  # a protocol's topic names and filters: validation and matching (MQTT's)
    "topicmap": "logic",  # a protocol's names mapped to metaq topics, and a filter's topics (MQTT's; pure)
    "session": "state",  # a protocol's per-client session state (MQTT's: subscriptions, cursors, packet ids)
    "port": "front-end", "connection": "front-end",  # a feature's own listener and its connections (MQTT's)
    "websocket": "front-end",  # a feature's WebSocket listeners, its connections over them (MQTT's)
    "delivery": "front-end",  # what a connection's subscriptions read from the log and send (MQTT's)
    # an MQTT connection's operation groups (connection.py dispatches to them)
    "connect": "front-end", "publishes": "front-end", "subscriptions": "front-end", "acks": "front-end",
    "plainturn": "front-end",  # a device's read of plain PUBLISHes stored and acknowledged in one step (MQTT's)
    "copyturn": "service",  # a peer's frame of plain copies taken into the inbox in one step (MQTT cluster)
    # the MQTT delivery's operation groups (delivery.py's loop calls them) and the port's shared decodes
    "subscribing": "front-end", "outbound": "front-end", "resend": "front-end", "direct": "front-end",
    "fanplan": "front-end", "fanout": "front-end", "decoded": "state",
    "wills": "front-end",  # a port's wills: published, held for their delay, kept in its log, tried again (MQTT's)
    "sql": "logic",  # a filter language: its parser and compiled predicate (pure)
    "messages_pb2": "codec",  # protoc's Python code of the feature's .proto (generated at setup, never committed)
    "rpcs": "front-end",  # a gRPC service's RPC handlers
    "pulls": "front-end",  # a gRPC service's pull and offset RPC handlers
    "clientcommands": "front-end",  # an admin's questions to connected clients on their streams (gRPC's Telemetry)
    "renewer": "front-end",  # a gRPC port's keeping of its clients' messages invisible while they live (auto-renew)
    "routes": "logic",  # a cluster's routes: what one broker's subscriptions want of its peers (pure)
    "share": "logic",  # a cluster's shared groups: which broker's group takes what (pure, the clock passed in)
    "retained": "state",  # the retained messages of other brokers as this one knows them (MQTT cluster)
    "offer": "service",  # what a broker offers a cluster of its shared groups: their weights, settled (MQTT cluster)
    "inbox": "state",  # the copies of other brokers' messages in an internal topic, and where each resumes
    "serve": "service", "link": "service", "peers": "service",  # a cluster's links: served, followed, kept
    # a gRPC service's RPC groups (rpcs.py dispatches to them) and what they share
    "calls": "front-end", "routing": "front-end", "sends": "front-end", "receives": "front-end",
    "halves": "front-end", "telemetry": "front-end", "consumers": "front-end", "producers": "front-end",
    "ids": "state",  # which broker is a client id's home, and the home's registry of ids (MQTT cluster)
    "registrations": "service",  # a CONNECT's registration with its id's home, batched per home (MQTT cluster)
    "asks": "state",  # what a member of a cluster may ask of this broker: who it is, its calls' ids (MQTT cluster)
    "leases": "service",  # the leases of a cluster's homes: held, renewed, counted out (MQTT cluster)
    "members": "service",  # a cluster's members as ZooKeeper names them: one reader, its listeners woken (MQTT)
    "handover": "front-end",  # a session handed from one broker to another (MQTT cluster)
    "seam": "front-end",  # a feature's seam with another: the one interface it calls, and each side's implementation
    "headercache": "codec",  # HTTP/2 header blocks coded and checked once while a connection repeats them (gRPC's)
    "messagebytes": "front-end",  # a stored message as a gRPC client gets it, written as protobuf bytes
    "http2": "codec",  # a server's HTTP/2 connection, sans-IO (gRPC's): frames in, events out, frames to send
    "limits": "limits",  # the feature's named limits: constants, each with its reason (any layer may read them)
}

#: A role -> the layer whose rules its modules get. No role is the client's: a feature's client side (its calls of
#: the Producer and Consumer, its metaq-admin command) lives in metaq/client/, which imports the features' codecs, so
#: a feature module that imported the client would close a cycle of folders.
ROLE_LAYERS = {"codec": "protocol", "logic": "protocol", "state": "store", "service": "server",
               "front-end": "server", "limits": "limits"}


def feature_module_layer(parts):
    """The layer of the feature module ``parts`` (``["timers", "records"]``, ``["mqttcluster", "following",
    "link"]``); None for a name that is no role."""
    if len(parts) == 3 and parts[1] in FEATURE_PARTS.get(parts[0], ()):
        parts = [parts[0], parts[2]]  # a module of a sub-package: by its role, as in the package itself
    if len(parts) != 2:
        return None  # a feature package is flat but for its named sub-packages
    if parts[1] == "__init__":
        return "root"  # a docstring: the feature and its modules by role
    return ROLE_LAYERS.get(FEATURE_ROLES.get(parts[1]))


def layer_of(path, root=ROOT):
    rel = path.relative_to(root)
    if rel.name == "limits.py":
        return "limits"  # metaq/limits.py and every package's: the bottom floor, wherever the file lives
    if len(rel.parts) == 1:
        return {"errors.py": "errors", "limits.py": "limits", "__init__.py": "root",
                "speedups.py": "speedups", "clock.py": "clock",
                # the text command set: protocol/'s registry and the features' wire modules (codecs), composed
                "textcommands.py": "protocol",
                # the store opened with the features' state it holds: store/'s facade and the features' state, composed
                "storestate.py": "store",
                # metaq-admin: its own commands and each feature's command in client/admin/, composed
                "admincli.py": "client"}.get(rel.parts[0])
    if rel.parts[0] in FEATURES:
        return feature_module_layer(list(rel.with_suffix("").parts))
    return rel.parts[0]


def imported_names(tree):
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            for alias in node.names:
                yield node.lineno, alias.name
        elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
            if node.module.startswith("metaq.") and all(alias.name == "limits" for alias in node.names):
                yield node.lineno, node.module + ".limits"  # a package's limits (its __init__ is a docstring)
                continue
            yield node.lineno, node.module
            if node.module == "metaq" or node.module in {"metaq." + f for f in FEATURES} | {
                    "metaq.%s.%s" % (f, s) for f, subs in FEATURE_PARTS.items() for s in subs}:
                for alias in node.names:
                    yield node.lineno, node.module + "." + alias.name


#: The optional C helper and its loader (stdlib only, no metaq imports): any layer may use them.
LEAVES = {"metaq.native._bytes", "metaq.speedups", "metaq.native"}


def allowed(name, metaq_ok):
    parts = name.split(".")
    if parts[-1] == "limits" and len(parts) > 1:
        return "metaq.limits" in metaq_ok  # a package's named limits are the limits layer's, as metaq/limits.py is
    if len(parts) > 1 and parts[1] in FEATURES:
        if len(parts) == 2 or (len(parts) == 3 and parts[2] in FEATURE_PARTS.get(parts[1], ())):
            return True  # the feature package itself, or one of its sub-packages: a docstring
        layer = feature_module_layer(parts[1:4] if parts[2] in FEATURE_PARTS.get(parts[1], ()) else parts[1:3])
        return layer is not None and allowed("metaq." + layer, metaq_ok)
    return (any(name == ok or name.startswith(ok + ".") for ok in metaq_ok - {"metaq"}) or name == "metaq"
            or name in LEAVES or ("metaq" in metaq_ok and metaq_attribute(name)))


def metaq_attribute(name):
    """True if ``name`` is one of metaq/__init__.py's own names (``from metaq import lazy_exports``), not one of its
    layers or feature packages: "metaq" in a layer's set is that file, not every module under it."""
    parts = name.split(".")
    return len(parts) == 2 and parts[1] not in set(RULES) | FEATURES


def violations(path, root=ROOT):
    layer = layer_of(path, root)
    if layer not in RULES:
        return []
    metaq_ok, banned = RULES[layer]
    tree = ast.parse(path.read_text(), str(path))
    found = []
    for lineno, name in imported_names(tree):
        top = name.split(".")[0]
        if top == "metaq":
            if not allowed(name, metaq_ok):
                found.append("%s:%d imports %s (layer %s)" % (path.name, lineno, name, layer))
        elif top in banned:
            found.append("%s:%d imports %s (layer %s)" % (path.name, lineno, name, layer))
    return found


def monkey_patches(path):
    return "monkey.patch_all" in path.read_text() or "monkey.patch_" in path.read_text()


#: Every module of metaq/ but protoc's output (``*_pb2.py``: generated at setup, never committed, not ours to shape).
MODULES = sorted(p for p in ROOT.rglob("*.py") if not p.name.endswith("_pb2.py"))


@pytest.mark.parametrize("path", MODULES, ids=lambda p: str(p.relative_to(ROOT)))
def test_imports_respect_layers(path):
    assert violations(path) == []


def test_only_the_server_entry_point_monkey_patches():
    patchers = [str(p.relative_to(ROOT)) for p in MODULES if monkey_patches(p)]
    assert patchers == ["server/__main__.py"]


def test_every_module_has_a_layer():
    assert [str(p.relative_to(ROOT)) for p in MODULES if layer_of(p) not in RULES] == []


def test_every_feature_module_has_a_role():
    assert [str(p.relative_to(ROOT)) for p in MODULES
            if p.relative_to(ROOT).parts[0] in FEATURES and layer_of(p) is None] == []


def _fake_feature(tmp_path, modules):
    """A fake metaq/ with a feature package and a few layer modules: ``{relative path: source}``."""
    fake_root = tmp_path / "metaq"
    for rel, text in modules.items():
        (fake_root / rel).parent.mkdir(parents=True, exist_ok=True)
        (fake_root / rel).write_text(text)
    return fake_root


def test_feature_modules_get_their_roles_layer(tmp_path):
    fake_root = _fake_feature(tmp_path, {
        "timers/__init__.py": '"""A feature."""\n',
        "timers/records.py": "from metaq.protocol import checksum\nfrom metaq.timers import service\n",
        "timers/window.py": "import time\nfrom metaq.timers.records import X\n",
        "timers/index.py": "import sqlite3\nfrom metaq.timers import records, wire, window, handoff\n"
                           "import metaq.timers.service\nfrom metaq.timers.client import when_of\n",
        "timers/service.py": "import gevent\nfrom metaq.timers import index, records, text\n"
                             "import metaq.timers.client\n",
        "timers/client.py": "from metaq.timers import wire\nfrom metaq.timers.index import TimerIndex\n",
        "timers/helpers.py": "",
        "timers/sub/records.py": "",
    })
    layers = {p.relative_to(fake_root).as_posix(): layer_of(p, fake_root) for p in sorted(fake_root.rglob("*.py"))}
    assert layers == {"timers/__init__.py": "root", "timers/records.py": "protocol", "timers/window.py": "protocol",
                      "timers/index.py": "store", "timers/service.py": "server", "timers/client.py": None,
                      "timers/helpers.py": None, "timers/sub/records.py": None}
    found = {rel: violations(fake_root / rel, fake_root) for rel in layers}
    assert found == {
        "timers/__init__.py": [],
        "timers/records.py": ["records.py:2 imports metaq.timers.service (layer protocol)"],
        "timers/window.py": ["window.py:1 imports time (layer protocol)"],
        "timers/index.py": ["index.py:3 imports metaq.timers.service (layer store)",
                            "index.py:4 imports metaq.timers.client (layer store)"],
        "timers/service.py": ["service.py:3 imports metaq.timers.client (layer server)"],
        # no layer (test_every_feature_module_has_a_role): a feature's client side is in metaq/client/
        "timers/client.py": [], "timers/helpers.py": [], "timers/sub/records.py": [],
    }


def test_a_features_sub_packages_modules_get_their_roles_layer(tmp_path):
    """A named sub-package's modules are by role as the package's own; a module of an unnamed one has no layer."""
    fake_root = _fake_feature(tmp_path, {
        "mqttcluster/__init__.py": '"""A feature."""\n',
        "mqttcluster/following/__init__.py": '"""A concern."""\n',
        "mqttcluster/following/inbox.py": "from metaq.mqttcluster.following import peers\n"
                                          "from metaq.mqttcluster.sharing.share import Shares\n",
        "mqttcluster/following/peers.py": "import gevent\nfrom metaq.mqttcluster.following import inbox\n"
                                          "from metaq.mqttcluster import sharing\n",
        "mqttcluster/following/helpers.py": "",
        "mqttcluster/elsewhere/inbox.py": "",
        "protocol/x.py": "from metaq.mqttcluster.following.routes import aggregate\n"
                         "from metaq.mqttcluster.clientids import service\n",
    })
    layers = {p.relative_to(fake_root).as_posix(): layer_of(p, fake_root) for p in sorted(fake_root.rglob("*.py"))}
    assert layers == {"mqttcluster/__init__.py": "root", "mqttcluster/following/__init__.py": "root",
                      "mqttcluster/following/inbox.py": "store", "mqttcluster/following/peers.py": "server",
                      "mqttcluster/following/helpers.py": None, "mqttcluster/elsewhere/inbox.py": None,
                      "protocol/x.py": "protocol"}
    found = {rel: violations(fake_root / rel, fake_root) for rel in layers}
    assert found["mqttcluster/following/inbox.py"] == [
        "inbox.py:1 imports metaq.mqttcluster.following.peers (layer store)"]
    assert found["mqttcluster/following/peers.py"] == []
    assert found["protocol/x.py"] == ["x.py:2 imports metaq.mqttcluster.clientids.service (layer protocol)"]


def test_layers_import_a_features_modules_by_role(tmp_path):
    fake_root = _fake_feature(tmp_path, {
        "protocol/text.py": "from metaq.timers import wire\nimport metaq.timers.records\nimport metaq.timers\n"
                            "from metaq.timers import index\nfrom metaq.timers.window import DeliveryWindow\n",
        "store/store.py": "from metaq.timers import records, index\nfrom metaq.timers.service import TimerService\n",
        "server/broker.py": "from metaq.timers import service, http, text, index, records\n"
                            "from metaq.timers.client import when_of\n",
        "client/producer.py": "from metaq.timers.client import cancel\nfrom metaq.timers import wire, handoff\n",
        "deploy/agent.py": "from metaq.timers import records\nfrom metaq.timers import text\n",
        "protocol/other.py": "from metaq.timers import nosuch\nimport metaq.timers.nosuch.deeper\n",
        "server/other.py": "from metaq import lazy_exports, errors\nfrom metaq.client import producer\n",
    })
    found = {p.relative_to(fake_root).as_posix(): violations(p, fake_root) for p in sorted(fake_root.rglob("*.py"))}
    assert found == {
        "protocol/text.py": ["text.py:4 imports metaq.timers.index (layer protocol)"],
        "store/store.py": ["store.py:2 imports metaq.timers.service (layer store)"],
        "server/broker.py": ["broker.py:2 imports metaq.timers.client (layer server)"],
        "client/producer.py": ["producer.py:1 imports metaq.timers.client (layer client)",
                               "producer.py:2 imports metaq.timers.handoff (layer client)"],
        "deploy/agent.py": ["agent.py:2 imports metaq.timers.text (layer deploy)"],
        "protocol/other.py": ["other.py:1 imports metaq.timers.nosuch (layer protocol)",
                              "other.py:2 imports metaq.timers.nosuch.deeper (layer protocol)"],
        "server/other.py": ["other.py:2 imports metaq.client (layer server)"],
    }


def test_a_packages_limits_are_the_bottom_floor(tmp_path):
    """A ``limits.py`` anywhere is the limits layer: it imports errors and other limits only, and any layer may
    import it; in the folder graph it stands with metaq/limits.py, so a lower folder reading a feature's bound
    draws no arrow up to the feature."""
    fake_root = _fake_feature(tmp_path, {
        "timers/limits.py": "from metaq import limits\nfrom metaq.auth import limits as auth_limits\n",
        "server/http/limits.py": "import time\nfrom metaq.timers import records\nfrom metaq.server import config\n",
        "protocol/text.py": "from metaq.timers import limits as timers_limits\n"
                            "from metaq.server.http import limits as http_limits\n",
    })
    found = {p.relative_to(fake_root).as_posix(): violations(p, fake_root) for p in sorted(fake_root.rglob("*.py"))}
    assert found == {
        "timers/limits.py": [],
        "server/http/limits.py": ["limits.py:1 imports time (layer limits)",
                                  "limits.py:2 imports metaq.timers.records (layer limits)",
                                  "limits.py:3 imports metaq.server (layer limits)"],
        "protocol/text.py": [],
    }
    assert [folder_of(n) for n in ("metaq.limits", "metaq.timers.limits", "metaq.server.http.limits",
                                   "metaq.timers.records")] == ["limits", "limits", "limits", "timers"]


def test_checker_catches_a_forbidden_import(tmp_path):
    fake_root = tmp_path / "metaq"
    (fake_root / "store").mkdir(parents=True)
    bad = fake_root / "store" / "bad.py"
    bad.write_text("import socket\nfrom metaq.server import broker\nimport time\n")
    assert len(violations(bad, fake_root)) == 3


# -- import cycles --------------------------------------------------------------------------------------------


def module_name(path, root=ROOT):
    rel = path.relative_to(root.parent).with_suffix("")
    parts = list(rel.parts)
    if parts[-1] == "__init__":
        parts.pop()
    return ".".join(parts)


@functools.lru_cache(maxsize=None)
def module_index(root=ROOT):
    """{dotted name: path} of every module and package under ``root`` (a C extension counts as a module)."""
    index = {module_name(p, root): p for p in root.rglob("*.py")}
    for so in root.rglob("*.so"):
        index.setdefault(module_name(so.with_name(so.name.split(".")[0] + ".py"), root), so)
    return index


def resolve_from(path, node, root=ROOT):
    """The absolute module a ``from ... import`` names (relative imports resolved against ``path``)."""
    if node.level == 0:
        return node.module
    package = module_name(path, root).split(".")
    if path.name != "__init__.py":
        package = package[:-1]
    base = package[:len(package) - (node.level - 1)]
    return ".".join(base + ([node.module] if node.module else []))


def module_imports(path, index, root=ROOT):
    """The metaq modules ``path`` imports, at module level or deferred inside a function or a class: a deferred
    import is the same dependency, only taken later (``table()`` importing the module that imports every declaring
    module was the text registry's cycle), so the graph counts both."""
    tree = ast.parse(path.read_text(), str(path))
    found = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            found.update(alias.name for alias in node.names)
        elif isinstance(node, ast.ImportFrom):
            base = resolve_from(path, node, root)
            for alias in node.names:
                sub = "%s.%s" % (base, alias.name)
                found.add(sub if sub in index else base)
    return {name for name in found if name in index}


def import_graph(root=ROOT):
    index = module_index(root)
    return {name: module_imports(path, index, root) - {name}
            for name, path in index.items() if path.suffix == ".py"}


def import_cycles(graph):
    """Strongly connected components of more than one module (Tarjan), each sorted, in sorted order."""
    order, low, stack, on_stack, found = {}, {}, [], set(), []
    sys.setrecursionlimit(max(sys.getrecursionlimit(), 10 * len(graph) + 100))

    def visit(v):
        order[v] = low[v] = len(order)
        stack.append(v)
        on_stack.add(v)
        for w in sorted(graph.get(v, ())):
            if w not in order:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in on_stack:
                low[v] = min(low[v], order[w])
        if low[v] == order[v]:
            component = []
            while True:
                w = stack.pop()
                on_stack.discard(w)
                component.append(w)
                if w == v:
                    break
            if len(component) > 1:
                found.append(sorted(component))

    for v in sorted(graph):
        if v not in order:
            visit(v)
    return sorted(found)


def test_no_import_cycles():
    assert import_cycles(import_graph()) == []


def test_cycle_checker_catches_a_cycle(tmp_path):
    fake_root = tmp_path / "metaq"
    (fake_root / "store").mkdir(parents=True)
    (fake_root / "__init__.py").write_text("")
    (fake_root / "store" / "__init__.py").write_text("")
    (fake_root / "store" / "a.py").write_text("from metaq.store import b\n")
    (fake_root / "store" / "b.py").write_text("from . import c\n")
    (fake_root / "store" / "c.py").write_text("import metaq.store.a\n")
    (fake_root / "store" / "d.py").write_text("from metaq.store.c import late\n")  # into a cycle, not in it
    # A deferred import closes a cycle as surely as a module-level one: the registry that imports, when read,
    # the module that imports every declaration, each of which imports the registry.
    (fake_root / "store" / "registry.py").write_text("def table():\n    from metaq.store import declared\n")
    (fake_root / "store" / "declared.py").write_text("import metaq.store.feature\n")
    (fake_root / "store" / "feature.py").write_text("class F:\n    from metaq.store.registry import table\n")
    (fake_root / "store" / "leaf.py").write_text("try:\n    from metaq.store import feature\n"
                                                 "except ImportError:\n    feature = None\n")
    assert import_cycles(import_graph(fake_root)) == [
        ["metaq.store.a", "metaq.store.b", "metaq.store.c"],
        ["metaq.store.declared", "metaq.store.feature", "metaq.store.registry"]]


def test_cycle_finder_on_a_graph():
    """Tarjan's components on a small graph: two cycles, a self-loop (no cycle: a module is not its own import),
    a chain into a cycle and an isolated module."""
    graph = {"a": {"b"}, "b": {"c"}, "c": {"a", "d"}, "d": {"e"}, "e": {"d"}, "f": {"a"}, "g": set(), "h": {"h"}}
    assert import_cycles(graph) == [["a", "b", "c"], ["d", "e"]]
    assert import_cycles({"x": {"y"}, "y": set()}) == []


# -- folders that import one way -------------------------------------------------------------------------------
#
# A folder is a package directly under metaq/ (its subpackages with it) or a module at the root; the folder graph
# has an arrow from one folder to another when a module of the first imports one of the second (deferred imports
# counted). Without the arrows named in UPWARD the graph has no cycle, so its folders stand on floors, each above
# what it imports; each named arrow points up (the folder it imports reaches back to it), for the reason given.
# Two folders that import each other are one of those arrows and its way back.

#: The arrows that point up, each with its reason; every other arrow between folders points down. None is left: a
#: lower folder that gave the features what they build on and also assembled them was split, the assembly moved
#: above (metaq/textcommands.py, metaq/storestate.py, metaq/admincli.py; the server's parts the features use in
#: metaq/serving/), and the features' client sides moved into metaq/client/ (its docstring says why), so no
#: feature imports the client. A new one names its reason here and raises the bounds.
UPWARD = {}

#: The bounds: arrows that point up, and pairs of folders that import each other. A change that adds one fails.
UPWARD_BOUND = 0
FOLDER_PAIRS_BOUND = 0


def folder_of(name):
    """The folder of the module ``name``: ``metaq.server.text.dispatch`` -> ``server``, ``metaq.clock`` -> ``clock``,
    ``metaq`` -> ``metaq``; a package's named limits (``metaq.mqtt.limits``) -> ``limits``: each lives beside its
    feature's code for reading, and stands on the bottom floor with metaq/limits.py (it imports only errors and
    other limits), so a lower folder reading a feature's bound draws no arrow up to the feature."""
    parts = name.split(".")
    if len(parts) > 2 and parts[-1] == "limits":
        return "limits"
    return parts[1] if len(parts) > 1 else parts[0]


def folder_graph(graph):
    """``{folder: {folders it imports}}`` of a module import graph, a folder's imports of itself left out."""
    folders = {}
    for name, imports in graph.items():
        mine = folder_of(name)
        folders.setdefault(mine, set()).update(folder_of(i) for i in imports if folder_of(i) != mine)
    return folders


def folder_pairs(folders):
    """The pairs of folders that import each other, each sorted, in sorted order."""
    return sorted({tuple(sorted((a, b))) for a, bs in folders.items() for b in bs if a in folders.get(b, ())})


def without(folders, arrows):
    """``folders`` without ``arrows``."""
    return {a: {b for b in bs if (a, b) not in arrows} for a, bs in folders.items()}


def reaches(folders, start, goal):
    """True when ``goal`` is reached from ``start`` along the arrows."""
    seen, todo = set(), [start]
    while todo:
        f = todo.pop()
        if f == goal:
            return True
        if f not in seen:
            seen.add(f)
            todo.extend(folders.get(f, ()))
    return False


def upward_check(folders, upward):
    """What is wrong with ``upward`` as the arrows that point up: cycles left without them, and named arrows that
    are not arrows or do not point up (nothing they import reaches back); empty when right."""
    rest = without(folders, upward)
    found = ["cycle without the upward arrows: %s" % " ".join(c) for c in import_cycles(rest)]
    for a, b in sorted(upward):
        if b not in folders.get(a, ()):
            found.append("%s -> %s is no arrow" % (a, b))
        elif not reaches(rest, b, a):
            found.append("%s -> %s points down" % (a, b))
    return found


def test_folders_import_one_way_but_the_named_arrows():
    folders = folder_graph(import_graph())
    assert upward_check(folders, set(UPWARD)) == []
    assert len(UPWARD) <= UPWARD_BOUND


def test_few_folders_import_each_other():
    """Each pair of folders that import each other is an upward arrow (named, with its reason) and its way back."""
    pairs = folder_pairs(folder_graph(import_graph()))
    assert [p for p in pairs if (p[0], p[1]) not in UPWARD and (p[1], p[0]) not in UPWARD] == []
    assert len(pairs) <= FOLDER_PAIRS_BOUND


def test_folder_checks_on_a_graph():
    graph = {"metaq.store.a": {"metaq.protocol.p"}, "metaq.store.b": {"metaq.feat.x", "metaq.store.a"},
             "metaq.feat.x": {"metaq.store.a", "metaq.server.s"}, "metaq.server.s": {"metaq.feat.y", "metaq.clock"},
             "metaq.protocol.p": set(), "metaq.clock": set(), "metaq.feat.y": set()}
    folders = folder_graph(graph)
    assert folders == {"store": {"protocol", "feat"}, "feat": {"store", "server"}, "server": {"feat", "clock"},
                       "protocol": set(), "clock": set()}
    assert folder_pairs(folders) == [("feat", "server"), ("feat", "store")]
    assert upward_check(folders, {("store", "feat"), ("feat", "server")}) == []
    assert upward_check(folders, {("store", "feat")}) == ["cycle without the upward arrows: feat server"]
    assert upward_check(folders, {("store", "feat"), ("feat", "server"), ("feat", "protocol"), ("server", "clock")}) \
        == ["feat -> protocol is no arrow", "server -> clock points down"]


# -- private names across modules -----------------------------------------------------------------------------

#: Attribute names that start with "_" but are public API (namedtuple's methods; os._exit is the documented way
#: out of a forked or wedged process; sys._getframe for loggers).
PUBLIC_UNDERSCORE = {"_replace", "_asdict", "_fields", "_make", "_field_defaults", "_exit", "_getframe"}


#: A private module imported from outside its package, and by which module only: the C helper by its loader.
PRIVATE_IMPORTS = {("metaq.native._bytes", "speedups.py")}


def is_private(name):
    return name.startswith("_") and not (name.startswith("__") and name.endswith("__")) and \
        name not in PUBLIC_UNDERSCORE


def private_access(path, root=ROOT):
    """``(relative path, line, what)`` for each private name of another module this module takes."""
    rel = str(path.relative_to(root))
    tree = ast.parse(path.read_text(), str(path))
    index = module_index(root)
    found = []
    module_aliases = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            for alias in node.names:
                module_aliases.add(alias.asname or alias.name.split(".")[0])
        elif isinstance(node, ast.ImportFrom):
            base = resolve_from(path, node, root)
            for alias in node.names:
                sub = "%s.%s" % (base, alias.name)
                if sub in index:
                    module_aliases.add(alias.asname or alias.name)
                    # a package-private module may be imported by its own package
                    if is_private(alias.name) and sub.rsplit(".", 1)[0] != module_name(path, root).rsplit(".", 1)[0] \
                            and (sub, rel) not in PRIVATE_IMPORTS:
                        found.append((rel, node.lineno, "from %s import %s" % (base, alias.name)))
                elif is_private(alias.name) and (sub, rel) not in PRIVATE_IMPORTS:
                    found.append((rel, node.lineno, "from %s import %s" % (base, alias.name)))
    for node in ast.walk(tree):
        if isinstance(node, ast.Attribute) and is_private(node.attr):
            owner = node.value
            if isinstance(owner, ast.Name) and owner.id in ("self", "cls"):
                continue
            if isinstance(owner, ast.Call) and isinstance(owner.func, ast.Name) and owner.func.id == "super":
                continue
            what = "%s.%s" % (ast.unparse(owner), node.attr)
            if isinstance(owner, ast.Name) and owner.id in module_aliases:
                what = "module " + what
            found.append((rel, node.lineno, what))
    return sorted(found, key=lambda v: (v[1], v[2]))


#: Private names of other projects that have no public equivalent, each with its reason.
ALLOWED_FOREIGN = {
    # pyspark has no public "is a SparkContext running in this JVM" that works from any thread; the report must
    # know, so that it stops only a session it created itself.
    "spark/report.py: SparkContext._active_spark_context",
}


def test_no_private_names_across_modules():
    found = [v for p in MODULES for v in private_access(p)]
    new = ["%s:%d %s" % v for v in found if "%s: %s" % (v[0], v[2]) not in ALLOWED_FOREIGN]
    assert new == []


def test_private_checker_catches_each_kind(tmp_path):
    fake_root = tmp_path / "metaq"
    (fake_root / "store").mkdir(parents=True)
    (fake_root / "__init__.py").write_text("")
    (fake_root / "store" / "__init__.py").write_text("")
    (fake_root / "store" / "a.py").write_text("_hidden = 1\n")
    bad = fake_root / "store" / "b.py"
    bad.write_text("from metaq.store.a import _hidden\n"
                   "from metaq.store import a\n"
                   "import collections\n"
                   "\n"
                   "\n"
                   "class B(collections.namedtuple('B', 'x')):\n"
                   "    def f(self, other):\n"
                   "        self._mine = a._hidden\n"
                   "        super()._also_mine()\n"
                   "        return other._theirs, self.x._nested, self._replace(x=1), other.__class__\n")
    assert private_access(bad, fake_root) == [
        ("store/b.py", 1, "from metaq.store.a import _hidden"),
        ("store/b.py", 8, "module a._hidden"),
        ("store/b.py", 10, "other._theirs"),
        ("store/b.py", 10, "self.x._nested"),
    ]


# -- structure rules ------------------------------------------------------------------------------------------
#
# One concept per module, whatever its length; no class split into mixins; no private re-exported under a public
# name; no component handed a front-end or the broker whole. What ast can see of these is checked below.

#: A module longer than this says why in its docstring: a line starting "Long because".
LONG_MODULE_LINES = 1200


def long_without_reason(path):
    """True if ``path`` is longer than LONG_MODULE_LINES and its docstring has no line starting "Long because"."""
    text = path.read_text()
    if len(text.splitlines()) <= LONG_MODULE_LINES:
        return False
    doc = ast.get_docstring(ast.parse(text, str(path))) or ""
    return not any(line.strip().startswith("Long because") for line in doc.splitlines())


def test_a_long_module_says_why():
    assert [str(p.relative_to(ROOT)) for p in MODULES if long_without_reason(p)] == []


def test_long_module_checker(tmp_path):
    body = "x = 1\n" * LONG_MODULE_LINES
    short, silent, reasoned = tmp_path / "short.py", tmp_path / "silent.py", tmp_path / "reasoned.py"
    short.write_text('"""Short."""\n' + body[:-6])
    silent.write_text('"""A concept."""\n' + body)
    reasoned.write_text('"""A concept.\n\nLong because its state machine is one table."""\n' + body)
    assert [long_without_reason(p) for p in (short, silent, reasoned)] == [False, True, False]


def _base_name(node):
    return node.attr if isinstance(node, ast.Attribute) else node.id if isinstance(node, ast.Name) else None


#: Project classes used as the single base of one class and nowhere else by name, each with its reason.
ALLOWED_SINGLE_USE_BASES = {
    # typing.NamedTuple forbids overriding __new__: Xid checks its fields in a subclass of the tuple that holds them.
    "client/transactions.py: _XidFields",
}


def mixins(root=ROOT):
    """``(relative path, line, what)`` for each class split into project classes.

    Two rules. A class with two or more project classes among its bases fails. A project class that is the base of
    exactly one class and whose name is used nowhere else (no call, isinstance, annotation or attribute: only
    imports and that base list) is a piece of its subclass, split off: it fails too.
    """
    # One file's tree at a time: holding every tree at once makes a long-lived test worker's collector walk them
    # all again and again.
    paths = sorted(root.rglob("*.py"))
    defs, bases = _classes(paths)
    found, subclasses = [], {}
    for path, lineno, name, its_bases in bases:
        ours = [(base, text) for base, text in its_bases if base in defs]
        if len(ours) > 1:
            found.append((str(path.relative_to(root)), lineno, "%s(%s)" % (name, ", ".join(t for _, t in ours))))
        for base, _ in ours:
            subclasses.setdefault(base, []).append(name)
    used = _names_used(paths)
    for name, subs in subclasses.items():
        if len(subs) == 1 and name not in used:
            for path, lineno in defs[name]:
                what = "%s: %s" % (path.relative_to(root), name)
                if what not in ALLOWED_SINGLE_USE_BASES:
                    found.append((str(path.relative_to(root)), lineno, "%s only mixed into %s" % (name, subs[0])))
    return sorted(found)


def _classes(paths):
    """``(defs, bases)`` of the files at ``paths``: ``{class name: [(path, line)]}`` and, for each class, ``(path,
    line, name, [(base name, base text)])``."""
    defs, bases = {}, []
    for path in paths:
        for node in ast.walk(ast.parse(path.read_text(), str(path))):
            if isinstance(node, ast.ClassDef):
                defs.setdefault(node.name, []).append((path, node.lineno))
                bases.append((path, node.lineno, node.name, [(_base_name(b), ast.unparse(b)) for b in node.bases]))
    return defs, bases


def _names_used(paths):
    """Every name and attribute the files at ``paths`` use outside the base lists of their classes."""
    used = set()
    for path in paths:
        tree = ast.parse(path.read_text(), str(path))
        base_nodes = {id(b) for node in ast.walk(tree) if isinstance(node, ast.ClassDef) for b in node.bases}
        for node in ast.walk(tree):
            if id(node) in base_nodes:
                continue
            if isinstance(node, ast.Name):
                used.add(node.id)
            elif isinstance(node, ast.Attribute):
                used.add(node.attr)
    return used


def test_no_class_is_split_into_mixins():
    assert mixins() == []


def test_mixin_checker_catches_both_kinds(tmp_path):
    fake_root = tmp_path / "metaq"
    fake_root.mkdir()
    (fake_root / "parts.py").write_text("class Figures:\n    pass\n\n\nclass Cold:\n    pass\n\n\n"
                                        "class Reads:\n    pass\n\n\nclass Base:\n    pass\n")
    (fake_root / "whole.py").write_text("from metaq import parts\nfrom metaq.parts import Reads\n\n\n"
                                        "class Store(parts.Figures, parts.Cold):\n    pass\n\n\n"
                                        "class Consumer(Reads):\n    pass\n\n\n"
                                        "class Fetcher(parts.Base):\n    pass\n\n\n"
                                        "def make():\n    return parts.Base()\n")
    assert mixins(fake_root) == [("parts.py", 1, "Figures only mixed into Store"),
                                 ("parts.py", 5, "Cold only mixed into Store"),
                                 ("parts.py", 9, "Reads only mixed into Consumer"),
                                 ("whole.py", 5, "Store(parts.Figures, parts.Cold)")]


def public_aliases_of_privates(path, root=ROOT):
    """``(relative path, line, what)`` for each public module- or class-level name bound to a private one
    (``ack_put = _ack``): a private re-exported under a public name."""
    tree = ast.parse(path.read_text(), str(path))
    found = []
    for scope in [tree] + [n for n in ast.walk(tree) if isinstance(n, ast.ClassDef)]:
        for node in scope.body:
            if isinstance(node, ast.Assign):
                targets, value = node.targets, node.value
            elif isinstance(node, ast.AnnAssign) and node.value is not None:
                targets, value = [node.target], node.value
            else:
                continue
            source = _base_name(value)
            if source is None or not is_private(source):
                continue
            for target in targets:
                if isinstance(target, ast.Name) and not target.id.startswith("_"):
                    found.append((str(path.relative_to(root)), node.lineno, ast.unparse(node)))
    return found


def test_no_private_is_re_exported_under_a_public_name():
    assert [v for p in MODULES for v in public_aliases_of_privates(p)] == []


def test_alias_checker_catches_module_and_class_level(tmp_path):
    fake_root = tmp_path / "metaq"
    fake_root.mkdir()
    bad = fake_root / "bad.py"
    bad.write_text("def _f():\n    pass\n\n\nf = _f\n_g = _f\n\n\nclass A:\n    def _ack(self):\n        pass\n\n"
                   "    ack_put = _ack\n    __call__ = _ack\n    put = staticmethod(_f)\n")
    assert public_aliases_of_privates(bad, fake_root) == [("bad.py", 5, "f = _f"), ("bad.py", 13, "ack_put = _ack")]


#: Constructor parameters that name a whole front-end or the broker: a component is given the few things it uses
#: (a callable, the store, the put path ...), never what assembles them.
FRONT_END_PARAMETERS = {"broker", "server", "front", "frontend", "front_end", "dispatcher", "text_server",
                        "text_front_end", "remoting_server", "remoting_dispatcher", "replication_server", "http_server",
                        "http_port"}

#: Not a component handed a front-end: the front-end itself, assembled from the parts that make it, and the
#: connections a front-end makes for itself (each reads what its front-end's connections share: limits, the
#: dispatcher, shutdown).
FRONT_END_PARTS = {
    # The text front-end is its listener and its dispatcher.
    "server/text/server.py: TextFrontEnd(dispatcher)",
    "server/text/connection.py: Connection(front)",
    "server/remoting/server.py: RemotingConnection(server)",
    "server/replication/master.py: SlaveConnection(server)",
}


def front_ends_handed(path, root=ROOT):
    """``(relative path, line, "Class(parameter)")`` for each ``__init__`` parameter named after a front-end."""
    tree = ast.parse(path.read_text(), str(path))
    found = []
    for cls in [n for n in ast.walk(tree) if isinstance(n, ast.ClassDef)]:
        for node in cls.body:
            if isinstance(node, ast.FunctionDef) and node.name == "__init__":
                args = node.args
                for a in args.posonlyargs + args.args[1:] + args.kwonlyargs:
                    if a.arg.rstrip("_") in FRONT_END_PARAMETERS:
                        found.append((str(path.relative_to(root)), node.lineno, "%s(%s)" % (cls.name, a.arg)))
    return found


def test_no_component_is_handed_a_front_end_whole():
    found = {"%s: %s" % (v[0], v[2]) for p in MODULES for v in front_ends_handed(p)}
    assert sorted(found - FRONT_END_PARTS) == [], "give these what they use, not the front-end"


def test_front_end_checker(tmp_path):
    fake_root = tmp_path / "metaq"
    fake_root.mkdir()
    bad = fake_root / "bad.py"
    bad.write_text("class A:\n    def __init__(self, store, dispatcher, *, core_, broker=None):\n        pass\n\n\n"
                   "class B:\n    def __init__(self, server_hostname, put_path):\n        pass\n")
    assert front_ends_handed(bad, fake_root) == [("bad.py", 2, "A(dispatcher)"), ("bad.py", 2, "A(broker)")]


#: The store's write methods: each appends to the commit log. Only the put path (serving/putpath.py) names them, so
#: that what follows a write (statistics, registration, waking readers, the flush, the acknowledgement) is decided in
#: one place; the store calls its own.
STORE_WRITES = {"put", "put_burst", "put_idempotent", "put_idempotent_prepared", "put_idempotent_run",
                "append_replicated"}

#: The put path: the one module outside the store that may name a store write method.
PUT_PATH = "serving/putpath.py"


def _store_names(tree):
    """Names bound, anywhere in ``tree``, to a name or attribute that names a store (``s = self.store``,
    ``store = path.store``; not a call's result): a write called on one of them is a store write too."""
    names = set()
    for node in ast.walk(tree):
        if isinstance(node, (ast.Assign, ast.AnnAssign)) and isinstance(node.value, (ast.Name, ast.Attribute)) \
                and "store" in ast.unparse(node.value).lower():
            targets = node.targets if isinstance(node, ast.Assign) else [node.target]
            names.update(t.id for t in targets if isinstance(t, ast.Name))
    return names


def store_writes(root=ROOT):
    """``{(module, method)}`` of every store write method named outside the store package and the put path: called
    or taken (``put = self.store.put``), on any object for a name only the store has (``put_burst`` ...), and
    ``put`` on an object that names a store (``store``, ``self._store``, ``path.store``, a name bound to one)."""
    found = set()
    for path in sorted(root.rglob("*.py")):
        rel = str(path.relative_to(root))
        if rel.startswith("store/") or rel == PUT_PATH or rel.endswith("_pb2.py"):
            continue
        tree = ast.parse(path.read_text(), str(path))
        bound = _store_names(tree)
        for node in ast.walk(tree):
            if not isinstance(node, ast.Attribute) or node.attr not in STORE_WRITES:
                continue
            receiver = ast.unparse(node.value)
            if node.attr != "put" or "store" in receiver.lower() or receiver in bound:
                found.add((rel, node.attr))
    return found


def test_only_the_put_path_writes_to_the_store():
    assert sorted(store_writes()) == []  # a write that bypasses the put path (serving/putpath.py)


def test_store_writes_are_every_append_of_the_store():
    """Every method of the store that appends to the log is in STORE_WRITES: a new one is refused too."""
    tree = ast.parse((ROOT / "store" / "store.py").read_text())
    store_class = next(n for n in tree.body if isinstance(n, ast.ClassDef) and n.name == "MessageStore")
    appends = {f.name for f in store_class.body if isinstance(f, ast.FunctionDef)
               and (f.name.startswith("put") or f.name.startswith("append_"))}
    assert appends == STORE_WRITES


def test_store_write_checker_catches_each_method(tmp_path):
    fake_root = tmp_path / "metaq"
    (fake_root / "server").mkdir(parents=True)
    (fake_root / "serving").mkdir()
    (fake_root / "store").mkdir()
    (fake_root / "serving" / "putpath.py").write_text("def a(self):\n    self.store.put(1)\n")
    (fake_root / "store" / "store.py").write_text("def a(self):\n    self.put_burst(1)\n")
    (fake_root / "server" / "front.py").write_text(
        "def a(self, fast, store, port):\n"
        "    self._store.put(1)\n    fast.store.put_burst(1)\n    store.put_idempotent_run(1)\n"
        "    port.append_replicated(1)\n"
        "    self.queue.put(1)\n    self.path.append(1)\n")
    (fake_root / "server" / "alias.py").write_text(
        "def a(self):\n    put = self.store.put\n    put(1)\n\n\n"
        "def b(self):\n    s = self.path.store\n    s.put(1)\n    s.put_idempotent(1)\n")
    assert store_writes(fake_root) == {("server/front.py", "put"), ("server/front.py", "put_burst"),
                                       ("server/front.py", "put_idempotent_run"),
                                       ("server/front.py", "append_replicated"),
                                       ("server/alias.py", "put"), ("server/alias.py", "put_idempotent")}


# -- every call names what runs -----------------------------------------------------------------------------------


def shadowed_methods(path):
    """``Class.name`` for each instance attribute a class's own code assigns over one of its methods
    (``self.notify = partial(...)`` where ``def notify`` is in the class): a call site then does not tell what
    runs (issue: a speed-up is chosen where a module is imported, never patched onto objects)."""
    tree = ast.parse(path.read_text(), str(path))
    found = []
    for cls in ast.walk(tree):
        if not isinstance(cls, ast.ClassDef):
            continue
        methods = {n.name for n in cls.body if isinstance(n, (ast.FunctionDef, ast.AsyncFunctionDef))}
        for node in ast.walk(cls):
            targets = node.targets if isinstance(node, ast.Assign) else (
                [node.target] if isinstance(node, (ast.AnnAssign, ast.AugAssign)) else [])
            for target in targets:
                for t in (target.elts if isinstance(target, ast.Tuple) else [target]):
                    if (isinstance(t, ast.Attribute) and isinstance(t.value, ast.Name) and t.value.id == "self"
                            and t.attr in methods):
                        found.append("%s:%d %s.%s" % (path.name, node.lineno, cls.name, t.attr))
    return found


def test_no_method_is_shadowed_by_an_instance_attribute():
    assert [v for p in MODULES for v in shadowed_methods(p)] == []


def test_the_shadow_check_sees_a_method_bound_over_by_a_partial(tmp_path):
    bad = tmp_path / "bad.py"
    bad.write_text("from functools import partial\n\nclass Waiters:\n    def __init__(self, fast):\n"
                   "        self.notify = partial(fast, self)\n\n    def notify(self, keys):\n        return keys\n")
    assert shadowed_methods(bad) == ["bad.py:5 Waiters.notify"]
