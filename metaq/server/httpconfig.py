"""The ``http:`` section of the configuration (README "The HTTP port"): its own module, so that
``server/config.py`` stays under the line cap. Pydantic only: ``metaq.deploy`` checks inventories against it."""

from typing import List, Optional

from pydantic import BaseModel, ConfigDict, Field, field_validator


class HttpSection(BaseModel):
    """``http:``: the HTTP port (metrics, health, JSON API, HTTP put/get, the dashboard)."""

    model_config = ConfigDict(extra="forbid", strict=True, allow_inf_nan=False)  # as every section's

    port: Optional[int] = Field(None, ge=0, le=65535)  # None or 0 = off
    host: Optional[str] = None  # bind address; default broker.host
    open_metrics: bool = True  # /metrics without authentication when security.acl_file is set (a scraper's view)
    # names a browser may reach the port by, beside IP addresses, localhost and this machine's host name (a
    # browser's request under another name may be DNS rebinding: routes.BrowserCheck); "*": any name
    allowed_hosts: List[str] = []

    @field_validator("host")
    @classmethod
    def _host(cls, host):
        if host is not None and not host.strip():
            raise ValueError("http.host must not be blank (leave it out to use broker.host)")
        return host

    @field_validator("allowed_hosts")
    @classmethod
    def _names(cls, names):
        for name in names:
            if not name.strip() or any(c in name for c in " /:@"):
                raise ValueError("http.allowed_hosts: %r is not a host name (a name without port, or \"*\")" % name)
        return [name.strip().lower().rstrip(".") for name in names]
