"""A tmpfs of a given size mounted for one test (needs root)."""

import contextlib
import os
import subprocess

import pytest


@contextlib.contextmanager
def tmpfs(path, size):
    if os.geteuid() != 0:
        pytest.skip("needs root to mount a tmpfs")
    os.makedirs(path, exist_ok=True)
    r = subprocess.run(["mount", "-t", "tmpfs", "-o", "size=%s" % size, "tmpfs", str(path)], capture_output=True)
    if r.returncode != 0:
        pytest.skip("cannot mount tmpfs: %s" % r.stderr.decode().strip())
    try:
        yield path
    finally:
        subprocess.run(["umount", "-l", str(path)], check=False)
