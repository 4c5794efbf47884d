"""Request-reply's named limits, each with the reason for its value.

A limits module: stdlib and other limits modules only, so that any layer may read it (metaq.limits
``modules`` finds every one for the configuration reference and the docs' checks).
"""

# -- request-reply (docs/messaging.md "Request-reply") ----------------------------------------
#: Text-protocol ``request``s one connection may have waiting for their replies at once
#: (``limits.max_pending_requests_per_connection``); past it a request is answered 503 at once, not stored.
MAX_PENDING_REQUESTS_PER_CONNECTION = 1024

#: Text-protocol ``request``s waiting for their replies on the whole broker (``limits.max_pending_requests``;
#: each holds a greenlet and a table entry); past it a request is answered 503 at once, not stored.
MAX_PENDING_REQUESTS = 20_000

#: Longest a ``request`` may wait for its reply (``limits.max_request_timeout_ms``); a longer timeout is cut to it.
MAX_REQUEST_TIMEOUT_MS = 300_000

#: Longest ``METAQ_REPLY_ERROR`` (what a failed handler raised) a reply carries; longer text is cut.
MAX_REPLY_ERROR_BYTES = 1024
