"""Counting one process's TCP connections to a Redis port (Linux ``/proc``): the
connection bound of a worker process is checked on the process itself, not inferred
from the client's pool."""

from __future__ import annotations

import os
from pathlib import Path

_ESTABLISHED = "01"


def _socket_inodes(pid: int) -> set[str]:
    inodes: set[str] = set()
    fd_dir = Path(f"/proc/{pid}/fd")
    for fd in os.listdir(fd_dir):
        try:
            target = os.readlink(fd_dir / fd)
        except OSError:  # closed meanwhile
            continue
        if target.startswith("socket:["):
            inodes.add(target[len("socket:[") : -1])
    return inodes


def tcp_connections_to(pid: int, port: int) -> int:
    """How many established TCP connections process ``pid`` holds to ``port`` now."""
    try:
        mine = _socket_inodes(pid)
    except OSError:  # the process is gone
        return 0
    n = 0
    for table in ("tcp", "tcp6"):
        try:
            lines = Path(f"/proc/{pid}/net/{table}").read_text().splitlines()[1:]
        except OSError:
            continue
        for line in lines:
            f = line.split()
            remote, state, inode = f[2], f[3], f[9]
            if (
                state == _ESTABLISHED
                and int(remote.rsplit(":", 1)[1], 16) == port
                and inode in mine
            ):
                n += 1
    return n
