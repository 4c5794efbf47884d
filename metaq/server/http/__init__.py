"""The HTTP port: metrics, health, the JSON API, HTTP put/get and the dashboard (docs/operating.md)."""
