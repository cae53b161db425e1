"""What a browser may do to the service: the ASGI middleware BrowserGuard
refuses a request whose Host is not an address the service answers to (DNS
rebinding), refuses an unsafe-method request sent from another site or
origin (CSRF), and adds the headers that keep pages out of frames and
scripts to the service's own files (CSP, X-Frame-Options, nosniff) and
answers out of caches (Cache-Control: no-store; /static's files excepted).

The CSRF rule, for every method but GET, HEAD and OPTIONS:
- a request with an `Authorization: Bearer` header passes: a page on
  another origin cannot add that header (pgdq allows no CORS), and the
  bearer header, not the cookie, then authenticates the request;
- otherwise `Sec-Fetch-Site`, when sent, must be `same-origin` (or `none`,
  the person's own navigation), and `Origin`, when sent, must name this
  server (its Host, or an allowed host);
- a request with neither header (curl, a script) passes unless it carries
  the dashboard's cookie: a request the cookie authenticates must say that
  it comes from the dashboard's page, which every current browser does."""

from __future__ import annotations

import functools
import ipaddress
from collections.abc import Awaitable, Callable, Iterable
from typing import Any
from urllib.parse import urlsplit

from ._access import TOKEN_COOKIE, error_response

Scope = dict[str, Any]
Receive = Callable[[], Awaitable[Any]]
Send = Callable[[Any], Awaitable[None]]

SAFE_METHODS = frozenset({"GET", "HEAD", "OPTIONS"})
DEFAULT_PORTS = {"http": 80, "https": 443, "ws": 80, "wss": 443}
LOOPBACK_NAMES = ("localhost", "127.0.0.1", "::1")

# Every answer: scripts, styles, fetches and forms only from this origin, in no frame.
CSP = (
    "default-src 'self'; script-src 'self'; style-src 'self'; img-src 'self' data:; connect-src 'self'; "
    "object-src 'none'; base-uri 'none'; form-action 'self'; frame-ancestors 'none'"
)
HEADERS = {
    "content-security-policy": CSP,
    "x-frame-options": "DENY",
    "x-content-type-options": "nosniff",
    "referrer-policy": "same-origin",
    "cross-origin-resource-policy": "same-origin",
}
# Every answer but the dashboard's static files: no browser or proxy keeps queue data (the back button after Sign out).
NO_STORE = {**HEADERS, "cache-control": "no-store"}
_ENCODED = {id(h): [(k.encode(), v.encode()) for k, v in h.items()] for h in (HEADERS, NO_STORE)}
STATIC_PREFIX = "/static/"


def split_host(host: str, default_port: int | None) -> tuple[str, int | None]:
    """A Host header or --allowed-host value as (lower-case name, port); default_port when it names none."""
    host = host.strip().lower()
    if host.startswith("["):
        name, _, rest = host[1:].partition("]")
        port = rest[1:] if rest.startswith(":") else ""
    else:
        name, sep, port = host.rpartition(":")
        if not sep or not port.isdigit() or ":" in name:
            name, port = host, ""
    return name, int(port) if port.isdigit() else default_port


def _is_loopback(name: str) -> bool:
    """True if name is localhost or a loopback address."""
    if name == "localhost":
        return True
    try:
        return ipaddress.ip_address(name).is_loopback
    except ValueError:
        return False


@functools.lru_cache(maxsize=64)
def served_hosts(server: tuple[str, int | None] | None) -> frozenset[tuple[str, int | None]]:
    """The (name, port) a request may name in Host for the socket it came in on (the loopback names too);
    cached: a server has few addresses, and every request asks."""
    if server is None or server[1] is None:
        return frozenset()
    name, port = server[0].lower().strip("[]"), server[1]
    names = {name, *LOOPBACK_NAMES} if _is_loopback(name) else {name}
    return frozenset((n, port) for n in names)


def host_allowed(host: str, scheme: str, server: tuple[str, int | None] | None, allowed: Iterable[str]) -> bool:
    """True if the Host header names the served address or an allowed host (one without a port: at any port)."""
    wanted = split_host(host, DEFAULT_PORTS.get(scheme))
    return wanted in served_hosts(tuple(server) if server is not None else None) or _in_allowed(wanted, allowed)


def _in_allowed(wanted: tuple[str, int | None], allowed: Iterable[str]) -> bool:
    """True if (name, port) is an allowed host's, or its name is one allowed at any port."""
    return any(split_host(a, None) in (wanted, (wanted[0], None)) for a in allowed)


def _netloc(url_or_host: str, scheme: str) -> str:
    """host[:port] in lower case, without scheme's default port."""
    name, port = split_host(url_or_host, None)
    name = f"[{name}]" if ":" in name else name
    return name if port is None or port == DEFAULT_PORTS.get(scheme) else f"{name}:{port}"


def same_origin(origin: str, scheme: str, host: str, allowed: Iterable[str]) -> bool:
    """True if an Origin header names this server: the request's Host (or an allowed host) and, over https, https."""
    parts = urlsplit(origin)
    if parts.scheme not in ("http", "https") or not parts.netloc or (scheme == "https" and parts.scheme != "https"):
        return False  # "null" (a sandboxed frame, a file, a data: URL) among others
    if _netloc(parts.netloc, parts.scheme) == _netloc(host, scheme):
        return True
    return _in_allowed(split_host(parts.netloc, DEFAULT_PORTS[parts.scheme]), allowed)


def cross_site_reason(scope: Scope, headers: dict[str, str], allowed: Iterable[str]) -> str | None:
    """Why an unsafe-method request may have come from another site or origin; None if it may pass (see above)."""
    if scope["method"] in SAFE_METHODS or headers.get("authorization", "").lower().startswith("bearer "):
        return None
    fetch_site, origin = headers.get("sec-fetch-site"), headers.get("origin")
    if fetch_site is not None and fetch_site.lower() not in ("same-origin", "none"):
        return f"Sec-Fetch-Site: {fetch_site}"
    if origin is not None and not same_origin(origin, scope["scheme"], headers.get("host", ""), allowed):
        return f"Origin: {origin}"
    if fetch_site is None and origin is None and f"{TOKEN_COOKIE}=" in headers.get("cookie", ""):
        return "the dashboard's cookie without Origin or Sec-Fetch-Site"
    return None


class BrowserGuard:
    """ASGI middleware: Host checked (when check_host), unsafe cross-site requests refused (403), HEADERS added."""

    def __init__(self, app: Callable[..., Awaitable[None]], check_host: bool, allowed_hosts: tuple[str, ...]) -> None:
        self.app, self.check_host, self.allowed_hosts = app, check_host, allowed_hosts

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return

        added = _ENCODED[id(HEADERS if scope["path"].startswith(STATIC_PREFIX) else NO_STORE)]

        async def with_headers(message: Any) -> None:
            if message["type"] == "http.response.start":
                present = {name.lower() for name, _ in message.get("headers", [])}
                extra = [(k, v) for k, v in added if k not in present]
                message["headers"] = [*message.get("headers", []), *extra]
            await send(message)

        refusal = self._refusal(scope)
        if refusal is None:
            await self.app(scope, receive, with_headers)
            return
        status, message = refusal
        await error_response(scope["path"], status, message)(scope, receive, with_headers)

    def _refusal(self, scope: Scope) -> tuple[int, str] | None:
        """(status, message) if the request is refused, else None."""
        headers = {k.decode("latin-1").lower(): v.decode("latin-1") for k, v in scope["headers"]}
        host = headers.get("host", "")
        if self.check_host and not host_allowed(host, scope["scheme"], scope.get("server"), self.allowed_hosts):
            return 421, (
                f"Host {host!r} is not an address this server answers to "
                "(behind a proxy, name it with pgdq serve --allowed-host)"
            )
        reason = cross_site_reason(scope, headers, self.allowed_hosts)
        if reason is not None:
            return 403, (
                f"refused a request from another site or origin ({reason}): the dashboard's actions must come "
                "from its own page, and scripts authenticate with an Authorization: Bearer header"
            )
        return None
