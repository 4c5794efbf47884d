"""The transaction manager's settings (the broker's ``transactions:`` section): the only place their defaults live.

``metaq.server.config`` takes them from here; ``TxConfig.validate`` names the first bad one.
"""

from typing import NamedTuple

from metaq.errors import ConfigError
from metaq.transactions.limits import MAX_OPEN_TRANSACTIONS, MAX_TX_HELD_BYTES
from metaq.transactions import records as R
from metaq.transactions.journal import MAX_JOURNAL_FILE_SIZE, MIN_JOURNAL_FILE_SIZE

FLUSH_POLICIES = ("commit", "os", "interval")
#: Largest ``max_tx_bytes`` accepted (a branch's messages are held in memory until it ends).
MAX_TX_BYTES_LIMIT = 1 << 30
#: Longest BEGIN timeout accepted as ``max_timeout_s`` (a day).
MAX_TIMEOUT_LIMIT_S = 86_400


class TxConfig(NamedTuple):
    """The broker's ``transactions:`` section; its defaults are the only ones (``metaq.server.config`` takes them)."""

    max_timeout_s: int = 60
    default_timeout_s: int = 60
    journal_flush: str = "commit"
    journal_file_size: int = 64 << 20
    max_puts_per_tx: int = 10000
    max_tx_bytes: int = 64 << 20
    max_open: int = MAX_OPEN_TRANSACTIONS
    max_held_bytes: int = MAX_TX_HELD_BYTES

    def validate(self):
        """Raise ConfigError naming the first bad setting."""
        checks = (("max_timeout_s", 1, MAX_TIMEOUT_LIMIT_S), ("default_timeout_s", 1, self.max_timeout_s),
                  ("journal_file_size", MIN_JOURNAL_FILE_SIZE, MAX_JOURNAL_FILE_SIZE),
                  ("max_puts_per_tx", 1, R.MAX_PUTS_LIMIT), ("max_tx_bytes", 1, MAX_TX_BYTES_LIMIT),
                  ("max_open", 1, 10 * MAX_OPEN_TRANSACTIONS), ("max_held_bytes", self.max_tx_bytes, 1 << 40))
        for name, low, high in checks:
            value = getattr(self, name)
            if not isinstance(value, int) or not low <= value <= high:
                raise ConfigError("transactions.%s must be an integer in %d..%d, got %r" % (name, low, high, value))
        if self.journal_flush not in FLUSH_POLICIES:
            raise ConfigError("transactions.journal_flush must be one of %s, got %r"
                              % ("/".join(FLUSH_POLICIES), self.journal_flush))
        return self
