import pytest

from metaq.client.local import rmq_config
from metaq.client.raw import RemotingClient


@pytest.fixture
def rmq_factory(broker_factory, tmp_path):
    """``make(remoting={...}, **sections)``: a real broker with a remoting port; returns the BrokerProcess."""
    count = [0]

    def make(remoting=None, **sections):
        count[0] += 1
        wd = tmp_path / ("rb%d" % count[0])
        return broker_factory(rmq_config(wd / "data", remoting, **sections), workdir=wd)

    return make


@pytest.fixture
def rmq_broker(rmq_factory):
    return rmq_factory(remoting={"max_reconsume_times": 1, "send_back_delay_level": 0})


@pytest.fixture
def rc(rmq_broker):
    """A raw remoting connection to ``rmq_broker``."""
    with RemotingClient(rmq_broker.config["remoting"]["port"]) as client:
        yield client
