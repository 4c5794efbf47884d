"""A tmpfs of a given size mounted for one test (needs root)."""

import contextlib
import errno
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


def fill(mount, leave=0):
    """A file ``mount``/filler (made anew) taking all of ``mount``'s free space but ``leave`` bytes; its path.

    A broker may write while the file grows, so a piece that no longer fits is halved, and the free space is looked
    at again after each piece that did: the disk ends with ``leave`` bytes free or fewer, never more.
    """
    path = os.path.join(str(mount), "filler")
    fd = os.open(path, os.O_RDWR | os.O_CREAT | os.O_TRUNC, 0o600)
    try:
        size, piece = 0, free_bytes(mount) - leave
        while piece > 0:
            try:
                os.posix_fallocate(fd, size, piece)
            except OSError as e:
                if e.errno != errno.ENOSPC:
                    raise
                piece //= 2
                continue
            size += piece
            piece = free_bytes(mount) - leave
    finally:
        os.close(fd)
    return path


def free_bytes(mount):
    """Bytes of ``mount`` an unprivileged writer may still take."""
    st = os.statvfs(str(mount))
    return st.f_bavail * st.f_frsize
