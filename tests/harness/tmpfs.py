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


@contextlib.contextmanager
def ext4_with_reserve(path, size_mb, reserved_percent):
    """An ext4 filesystem of ``size_mb`` MiB on a loop device at ``path``, ``reserved_percent`` kept for root.

    Such a filesystem's size is not used + available (``df`` leaves root's reserve out of both).
    """
    if os.geteuid() != 0:
        pytest.skip("needs root to mount a loop device")
    image = str(path) + ".img"
    with open(image, "wb") as f:
        f.truncate(size_mb << 20)
    r = subprocess.run(["mkfs.ext4", "-q", "-F", "-m", str(reserved_percent), image], capture_output=True)
    if r.returncode != 0:
        pytest.skip("cannot make an ext4 image: %s" % r.stderr.decode().strip())
    os.makedirs(path, exist_ok=True)
    r = subprocess.run(["mount", "-o", "loop", image, str(path)], capture_output=True)
    if r.returncode != 0:
        os.unlink(image)
        pytest.skip("cannot mount a loop device: %s" % r.stderr.decode().strip())
    try:
        yield path
    finally:
        subprocess.run(["umount", str(path)], check=False)
        os.unlink(image)
