"""docs/python-client.md "Where each class is imported from": the client's classes from ``metaq.client``, each
feature's client module under it, and the earlier paths refused by name. No broker."""

import importlib

import pytest

import metaq.client as client


def test_every_class_the_page_names_is_imported_from_the_client():
    for name in ("Producer", "Consumer", "SimpleConsumer", "LocalTransaction", "XAResource", "Xid", "XaError"):
        assert isinstance(getattr(client, name), type), name
    for feature in ("pop", "keys", "timers", "xa", "offsets", "priorities", "reqreply", "idempotence"):
        assert importlib.import_module("metaq.client." + feature).__name__ == "metaq.client." + feature
    assert callable(importlib.import_module("metaq.client.keys").lookup)


@pytest.mark.parametrize("path", ["metaq.pop.client", "metaq.transactions.resource", "metaq.keys.client",
                                  "metaq.offsets.client", "metaq.priorities.client", "metaq.reqreply.client",
                                  "metaq.timers.client", "metaq.idempotence.client"])
def test_an_earlier_path_fails_naming_the_module(path):
    with pytest.raises(ModuleNotFoundError, match=path.replace(".", r"\.")):
        importlib.import_module(path)
