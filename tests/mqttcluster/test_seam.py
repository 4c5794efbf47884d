"""The MQTT port's seam with the cluster (metaq/mqtt/seam.py, metaq/mqttcluster/seam.py): one interface the port
calls, a broker alone's that does nothing, the cluster's with the same methods; the port given it when made."""

import ast
import inspect
import pathlib
import re
from types import SimpleNamespace

from metaq.mqtt.seam import Alone
from metaq.mqttcluster.following import inbox
from metaq.mqttcluster.seam import ClusterSeam

ROOT = pathlib.Path(__file__).resolve().parents[2] / "metaq"


def _public(cls):
    return {name: getattr(cls, name) for name in dir(cls) if not name.startswith("_")}


def test_the_clusters_seam_answers_every_ask_of_the_contract_and_no_other():
    alone, cluster = _public(Alone), _public(ClusterSeam)
    assert sorted(alone) == sorted(cluster)
    for name, fn in alone.items():
        if callable(fn):
            assert inspect.signature(fn) == inspect.signature(cluster[name]), name
    assert Alone.topics == () and ClusterSeam.topics == (inbox.INBOX,)


def test_a_broker_alone_answers_as_alone():
    seam = Alone()
    assert seam.join("dev", True, None) is None and seam.knows_retained("a") is False
    assert seam.retained_for("a/#", {"a"}, ["r"]) == ["r"] and seam.group_takes(("g", "a/#"), "a", 0, None) is True
    assert seam.summary_values() == [] and seam.wait_followed() is None


def test_the_clusters_seam_takes_a_copy_by_its_groups_and_a_record_by_the_assignment():
    asked = []
    shares = SimpleNamespace(takes=lambda key, topic, partition, position: asked.append(
        (key, topic, partition, position)) or True)
    seam = ClusterSeam(SimpleNamespace(shares=shares), None, None)
    flag, data = inbox.marker(2, "t", 0, 5, 0, 0)
    assert seam.group_takes(("g", "a/#"), inbox.INBOX, 3, SimpleNamespace(flag=flag, data=data)) is False
    assert asked == []  # a copy is never assigned again here
    assert seam.group_takes(("g", "a/#"), "t", 1, SimpleNamespace(position=77)) is True
    assert asked == [(("g", "a/#"), "t", 1, 77)]


def _attributes_set_from_outside(path, names):
    """``(line, "obj.attr")`` of each assignment to ``obj.attr`` (attr in ``names``) on an object other than self."""
    found = []
    for node in ast.walk(ast.parse(path.read_text(), str(path))):
        if isinstance(node, (ast.Assign, ast.AugAssign, ast.AnnAssign)):
            for target in node.targets if isinstance(node, ast.Assign) else [node.target]:
                for t in ast.walk(target):
                    if isinstance(t, ast.Attribute) and t.attr in names and ast.unparse(t.value) != "self":
                        found.append((node.lineno, ast.unparse(t)))
    return found


def test_the_port_is_given_its_seam_and_asks_it_without_a_branch():
    """No module sets the port's, the client ids' or the asks' cluster parts after they are made; the MQTT package
    names no cluster module (its named limits aside: constants any layer may read) and never asks whether there is a
    cluster."""
    wired = {str(p.relative_to(ROOT)): found for p in sorted(ROOT.rglob("*.py"))
             if (found := _attributes_set_from_outside(p, {"cluster", "cluster_topics", "client_ids", "linked"}))}
    assert wired == {}
    for path in sorted((ROOT / "mqtt").glob("*.py")):
        text = path.read_text().replace("from metaq.mqttcluster import limits as mqttcluster_limits", "")
        assert "mqttcluster import" not in text and "import metaq.mqttcluster" not in text, path.name
        assert not re.search(r"\.cluster(_topics)? is ", text), path.name  # a branch on whether there is one
        assert ".client_ids" not in text, path.name


def test_the_checker_finds_an_attribute_set_from_outside(tmp_path):
    path = tmp_path / "m.py"
    path.write_text("self.cluster = 1\nport.cluster = 2\nport.cluster_topics, x = (), 1\nasks.linked = None\n")
    assert _attributes_set_from_outside(path, {"cluster", "cluster_topics", "linked"}) == [
        (2, "port.cluster"), (3, "port.cluster_topics"), (4, "asks.linked")]
