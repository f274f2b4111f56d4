"""Router URLs (amqp://HOST:PORT, amqps://HOST:PORT) and the address a redirect carries.

A draining router closes its client connections with `amqp:connection:redirect` (or refuses an
attach with `amqp:link:redirect`) whose info fields say where to go (AMQP 1.0 section 2.8.15:
`hostname`, `network-host`, `port`); ours add the router id (`oncemesh.router`).
"""

from __future__ import annotations

from typing import Any

from proton import ushort

from .symbols import REDIRECT_HOSTNAME, REDIRECT_NETWORK_HOST, REDIRECT_PORT, REDIRECT_ROUTER


def parse_url_tls(url: str) -> tuple[str, int, bool]:
    """(host, port, TLS?) of amqp://HOST:PORT (5672) or amqps://HOST:PORT (TLS, 5671)."""
    u = url.strip()
    scheme = "amqp"
    if "://" in u:
        scheme, u = u.split("://", 1)
        if scheme not in ("amqp", "amqps"):
            raise ValueError(f"unsupported URL scheme {scheme!r} in {url!r} (use amqp://HOST:PORT or "
                             f"amqps://HOST:PORT)")
    u = u.split("/", 1)[0]
    host, _, port = u.rpartition(":")
    if not host:
        host, port = u, "5671" if scheme == "amqps" else "5672"
    try:
        return host.strip("[]"), int(port), scheme == "amqps"
    except ValueError:
        raise ValueError(f"bad router URL {url!r}: expected amqp://HOST:PORT") from None


def redirect_info(url: str, router_id: str) -> dict[Any, Any]:
    """The info fields of a redirect to the router `router_id` whose clients connect at `url`."""
    host, port, _ = parse_url_tls(url)
    return {REDIRECT_HOSTNAME: host, REDIRECT_NETWORK_HOST: host, REDIRECT_PORT: ushort(port),
            REDIRECT_ROUTER: router_id}


def redirect_address(info: dict[Any, Any]) -> tuple[str, int] | None:
    """(network host, port) from a redirect's info fields, None when they name none."""
    host = info.get(REDIRECT_NETWORK_HOST) or info.get(REDIRECT_HOSTNAME)
    port = info.get(REDIRECT_PORT)
    if not isinstance(host, str) or not host or isinstance(port, bool) or not isinstance(port, int):
        return None
    return host, int(port)
