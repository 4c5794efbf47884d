"""The admin commands that ask each broker in turn (``client/admin/tools.ask_brokers``: ``dlq``, ``trace``,
``clients``), against two real brokers with authentication on: a 404 is "not here" and the next broker is asked,
every broker's reason shown when none has it; any other refusal stops the command (exit 3) in that command's own
words."""

from metaq import admincli as admin
from tests.harness.acl import SECRETS, secured_config


def _cluster(broker_factory, tmp_path):
    brokers = []
    for bid in (1, 2):
        wd = tmp_path / ("b%d" % bid)
        wd.mkdir()
        cfg = secured_config(wd)
        cfg["broker"]["id"] = bid
        brokers.append(broker_factory(cfg, workdir=wd))
    return ",".join("meta://127.0.0.1:%d" % b.port for b in brokers)


def _run(capsys, tmp_path, urls, user, *args):
    secret = tmp_path / ("%s.secret" % user)
    secret.write_text(SECRETS[user])
    secret.chmod(0o600)
    code = admin.main(["--brokers", urls, "--user", user, "--secret-file", str(secret)] + list(args))
    out = capsys.readouterr()
    return code, out.err


def test_each_broker_is_asked_and_a_refusal_keeps_its_commands_words(broker_factory, tmp_path, capsys):
    urls = _cluster(broker_factory, tmp_path)
    # not here (404) on either broker: both asked, in broker id order, each one's reason shown
    code, err = _run(capsys, tmp_path, urls, "admin", "clients", "stack", "nobody@1")
    assert code == admin.EXIT_REFUSED, err
    assert "no broker has client nobody@1: broker 1: this broker has no gRPC port" in err, err
    assert "; broker 2: this broker has no gRPC port" in err, err
    code, err = _run(capsys, tmp_path, urls, "admin", "trace", "--key", "k1", "--topic", "orders")
    assert code == admin.EXIT_REFUSED, err
    assert "no broker has a message with key k1 in topic orders\n  broker 1: " in err and "\n  broker 2: " in err, err
    code, err = _run(capsys, tmp_path, urls, "admin", "dlq", "list", "billing")
    assert code == admin.EXIT_REFUSED, err
    assert "no broker has dead letters of group billing (no topic %DLQ%billing)" in err, err
    # refused (403) by the first broker asked: the command stops there, in its own words
    code, err = _run(capsys, tmp_path, urls, "bob", "dlq", "list", "billing")
    assert code == admin.EXIT_REFUSED, err
    assert err.startswith("metaq-admin: broker 1 refused: ") and "user bob is not an admin" in err, err
    code, err = _run(capsys, tmp_path, urls, "bob", "clients", "stack", "nobody@1")
    assert code == admin.EXIT_REFUSED, err
    assert err.startswith("metaq-admin: broker 1: ") and "user bob is not an admin" in err, err
    assert "refused" not in err and "no broker has" not in err, err
    code, err = _run(capsys, tmp_path, urls, "bob", "trace", "--key", "k1", "--topic", "orders")
    assert code == admin.EXIT_REFUSED, err
    assert err.startswith("metaq-admin: broker 1 refused: ") and "may not subscribe to topic orders" in err, err
    assert "broker 2" not in err, err
