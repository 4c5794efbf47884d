"""Test harnesses: real servers as processes (broker, ZooKeeper, PostgreSQL, sshd, FUSE), raw clients and helpers.

Helpers only, no fixtures and no tests: the fixtures live in the conftests and use these.
"""
