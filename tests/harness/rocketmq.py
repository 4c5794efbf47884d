"""Helpers of the RocketMQ remoting tests: is the official client installed, which lines a consume run received.

The raw client is ``metaq.client.raw.RemotingClient``, brokers with a remoting port come from
``metaq.client.local.rmq_config``, and the official client runs through ``bench/rocketmq_peer.py``.
"""

import pytest


def require_official_client():
    try:
        import rocketmq  # noqa: F401  (only: is it there?)
    except ImportError:
        pytest.fail("the official RocketMQ client is not installed: it is in the test extra "
                    "(make test installs it; by hand: pip install rocketmq==0.4.4)")


def received(lines):
    """The message lines of a consume run."""
    return [line for line in lines if "body" in line]
