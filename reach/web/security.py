"""Who may use the console, and which requests may change anything.

The console can replay, purge and drain: an attacker who reaches it can lose dead letters
for good or take agents out of routing. What guards it (docs/web.md, *Security*):

* **Where it listens.** 127.0.0.1 by default; any other address needs a token
  (``reach web`` refuses to start without one).
* **The token.** With a token set, every request but the login page and the static files
  needs either the header ``Authorization: Bearer <token>`` (scripts) or a session cookie
  that a login with the token marked as signed in (browsers). Compared in constant time.
* **Host names.** On a loopback address, only requests naming the console by a loopback
  host (``127.0.0.1``, ``localhost``, ``[::1]``) are answered: a web page elsewhere that
  re-points its own domain at 127.0.0.1 (DNS rebinding) cannot read the console.
* **Cross-site requests (CSRF).** Every change is a POST carrying a token derived from the
  browser's session (HMAC of the session id under a secret made at start-up), checked
  against the session cookie; the cookie is ``SameSite=Strict`` and ``HttpOnly``; a POST
  whose ``Origin`` is not the console's own is refused. A page on another site can make a
  browser send a POST, but cannot read the token it would need.
* **Read-only mode.** ``--read-only`` shows no button that changes anything and refuses
  every POST but the login.

Sessions live in the signed cookie only (nothing is stored server-side); a restart makes
a new secret, which signs everyone out.
"""

from __future__ import annotations

import hashlib
import hmac
import ipaddress
import secrets
from dataclasses import dataclass
from http.cookies import SimpleCookie
from urllib.parse import urlsplit

COOKIE = "reach_web"
LOOPBACK_NAMES = ("localhost", "127.0.0.1", "[::1]", "::1")


def is_loopback(host: str) -> bool:
    """True for an address or name that only this machine reaches."""
    h = host.strip("[]")
    if h == "localhost":
        return True
    try:
        return ipaddress.ip_address(h).is_loopback
    except ValueError:
        return False


@dataclass(frozen=True, slots=True)
class Session:
    """One browser's session: its id and whether it signed in with the token."""

    sid: str
    signed_in: bool


class Guard:
    """The console's checks (see the module's docstring). ``token``: None when none is
    needed (a loopback bind without one); ``allowed_hosts``: the ``Host`` names (without
    port) answered, None for any."""

    def __init__(
        self,
        *,
        token: str | None,
        read_only: bool = False,
        allowed_hosts: frozenset[str] | None = None,
    ) -> None:
        self.token = token or None
        self.read_only = read_only
        self.allowed_hosts = allowed_hosts
        self._secret = secrets.token_bytes(32)

    # -- sessions -------------------------------------------------------------------------
    def _mac(self, text: str) -> str:
        return hmac.new(self._secret, text.encode(), hashlib.sha256).hexdigest()

    def new_session(self, *, signed_in: bool = False) -> Session:
        return Session(secrets.token_urlsafe(18), signed_in)

    def cookie_value(self, s: Session) -> str:
        body = f"{s.sid}.{int(s.signed_in)}"
        return f"{body}.{self._mac('session:' + body)}"

    def read_cookie(self, header: str | None) -> Session | None:
        """The session of a ``Cookie`` header, None when it has none or a forged one."""
        if not header:
            return None
        try:
            jar: SimpleCookie = SimpleCookie(header)
        except Exception:  # noqa: BLE001 - a malformed header is no session
            return None
        morsel = jar.get(COOKIE)
        if morsel is None:
            return None
        sid, _, rest = morsel.value.partition(".")
        flag, _, mac = rest.partition(".")
        if not sid or flag not in ("0", "1"):
            return None
        if not hmac.compare_digest(mac, self._mac(f"session:{sid}.{flag}")):
            return None
        return Session(sid, flag == "1")

    def set_cookie_header(self, s: Session) -> str:
        return f"{COOKIE}={self.cookie_value(s)}; Path=/; HttpOnly; SameSite=Strict"

    # -- checks ---------------------------------------------------------------------------
    def csrf_token(self, s: Session) -> str:
        """The token a form of this session carries."""
        return self._mac("csrf:" + s.sid)

    def csrf_ok(self, s: Session, given: str) -> bool:
        return bool(given) and hmac.compare_digest(given, self.csrf_token(s))

    def token_ok(self, given: str) -> bool:
        return self.token is not None and hmac.compare_digest(given.encode(), self.token.encode())

    def bearer_ok(self, authorization: str | None) -> bool:
        if not authorization or self.token is None:
            return False
        scheme, _, value = authorization.partition(" ")
        return scheme.lower() == "bearer" and self.token_ok(value.strip())

    def host_ok(self, host_header: str | None) -> bool:
        if self.allowed_hosts is None:
            return True
        if not host_header:
            return False
        return _hostname(host_header) in self.allowed_hosts

    def origin_ok(self, origin: str | None, host_header: str | None) -> bool:
        """A POST's ``Origin`` (when the browser sent one) names this console."""
        if not origin:
            return True
        if origin == "null":
            return False
        return urlsplit(origin).netloc.lower() == (host_header or "").lower()


def _hostname(host_header: str) -> str:
    """``Host`` without its port (``[::1]:8090`` -> ``[::1]``)."""
    h = host_header.strip().lower()
    if h.startswith("["):
        return h[: h.find("]") + 1] if "]" in h else h
    return h.rsplit(":", 1)[0] if ":" in h else h


def loopback_hosts(bound: str) -> frozenset[str]:
    """The host names a console bound to a loopback address answers to."""
    return frozenset({*LOOPBACK_NAMES, bound.lower()})
