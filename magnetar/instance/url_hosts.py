"""Where URL bindings may point: the operator's rule (the worker's ``url_binding_hosts``).

A function's author declares its URL bindings, so on a shared cluster a tenant could point
one at whatever the worker's machine reaches: the worker's own REST API on localhost, the
broker's admin port, the cloud's metadata service (169.254.169.254), other internal services.
The rule lists what bindings may reach:

* ``public``: any host whose address is public (globally routable);
* ``api.example.com``: that name, ``*.example.com``: the names under example.com, whatever
  they resolve to (the operator vouches for them, as for an internal service whose
  addresses change);
* ``10.1.2.3``, ``10.0.0.0/8``, ``fd00::/8``: those addresses, as IP literals in bindings or
  as what a name resolves to;
* ``*``: anything (localrun's rule: the user's own code on the user's own machine).

Loopback, link-local, private, shared, unspecified, multicast and other special-purpose
addresses are refused unless a listed range holds them. Admission checks what it can know
without DNS (an IP literal, a name when only listed names are allowed); the instance checks
the address each name resolves to at every connection, and connects to that address, so
that DNS cannot point an allowed name at a refused address.
"""

from __future__ import annotations

import ipaddress
import re
import socket
from dataclasses import dataclass, field
from typing import Any, NamedTuple

__all__ = [
    "ANY_HOST",
    "PUBLIC_HOSTS",
    "ResolvedAddress",
    "UrlHostRefusedError",
    "UrlHostRule",
    "address_kind",
]

IpAddress = ipaddress.IPv4Address | ipaddress.IPv6Address
IpNetwork = ipaddress.IPv4Network | ipaddress.IPv6Network

_PUBLIC = "public"
_ANY = "*"
_NAME = re.compile(r"[a-z0-9_]([a-z0-9_-]*[a-z0-9_])?(\.[a-z0-9_]([a-z0-9_-]*[a-z0-9_])?)*")
_PRIVATE = tuple(
    ipaddress.ip_network(network)
    for network in ("10.0.0.0/8", "172.16.0.0/12", "192.168.0.0/16", "fc00::/7")
)
"""RFC 1918 and unique local addresses (``is_private`` holds more: documentation, ...)."""
_METADATA = (ipaddress.ip_address("169.254.169.254"), ipaddress.ip_address("fd00:ec2::254"))
_SETTING = "url_binding_hosts"
"""The worker setting the rule comes from (named in refusals)."""


class UrlHostRefusedError(ValueError):
    """A binding's host, or the address it resolves to, is outside the rule."""


class ResolvedAddress(NamedTuple):
    """One address a host resolved to, as ``socket`` connects to it."""

    family: socket.AddressFamily
    sockaddr: tuple[Any, ...]
    """(host, port) for IPv4, (host, port, flowinfo, scope) for IPv6."""


@dataclass(frozen=True)
class UrlHostRule:
    """The hosts URL bindings may point at (see the module): ``entries`` as the operator
    wrote them; ValueError for one that is no name, pattern, address or range."""

    entries: tuple[str, ...] = (_PUBLIC,)
    _any: bool = field(init=False, repr=False, compare=False)
    _public: bool = field(init=False, repr=False, compare=False)
    _names: frozenset[str] = field(init=False, repr=False, compare=False)
    _suffixes: tuple[str, ...] = field(init=False, repr=False, compare=False)
    _networks: tuple[IpNetwork, ...] = field(init=False, repr=False, compare=False)

    def __post_init__(self) -> None:
        names: set[str] = set()
        suffixes: list[str] = []
        networks: list[IpNetwork] = []
        for raw in self.entries:
            entry = _normal(raw)
            if entry in (_ANY, _PUBLIC):
                continue
            try:
                networks.append(ipaddress.ip_network(entry, strict=False))
                continue
            except ValueError:
                pass
            name = entry.removeprefix("*.")
            if not _NAME.fullmatch(name):
                raise ValueError(
                    f"{raw!r} is no host name, *.domain pattern, IP address or address range "
                    f"(CIDR), nor '{_PUBLIC}' or '{_ANY}'"
                )
            if entry.startswith("*."):
                suffixes.append("." + name)
            else:
                names.add(name)
        normal = {_normal(entry) for entry in self.entries}
        object.__setattr__(self, "_any", _ANY in normal)
        object.__setattr__(self, "_public", _PUBLIC in normal)
        object.__setattr__(self, "_names", frozenset(names))
        object.__setattr__(self, "_suffixes", tuple(suffixes))
        object.__setattr__(self, "_networks", tuple(networks))

    def __str__(self) -> str:
        return ", ".join(self.entries) or "none"

    def check_binding(self, host: str) -> None:
        """UrlHostRefusedError unless a binding may name ``host`` (its URL's host): an IP
        literal must be allowed, a name must be listed or may resolve to an allowed address
        (which the instance checks at each request)."""
        if self._any or self._trusts(host):
            return
        literal = _literal(host)
        if literal is not None:
            if not self.allows_address(literal):
                raise UrlHostRefusedError(
                    f"host {host} is {_with_article(address_kind(literal))} address, which "
                    f"the worker's {_SETTING} ({self}) does not allow"
                )
        elif not (self._public or self._networks):
            raise UrlHostRefusedError(
                f"host {host} is not one of the hosts the worker's {_SETTING} ({self}) allows"
            )

    def allows_address(self, address: IpAddress) -> bool:
        """Whether a connection may go to ``address`` (in a listed range, or public when
        ``public`` is listed)."""
        address = _unmapped(address)
        if self._any or any(address in network for network in self._networks):
            return True
        return self._public and address_kind(address) == "public"

    def resolve(self, host: str, port: int) -> list[ResolvedAddress]:
        """The addresses a request to ``host`` may connect to: all of a trusted name's, the
        allowed ones otherwise; UrlHostRefusedError when none is allowed, socket.gaierror
        when the name does not resolve."""
        found = [
            ResolvedAddress(family, sockaddr)
            for family, _, _, _, sockaddr in socket.getaddrinfo(host, port, type=socket.SOCK_STREAM)
        ]
        if self._any or self._trusts(host):
            return found
        allowed = [item for item in found if self.allows_address(_address_of(item))]
        if not found:
            raise UrlHostRefusedError(f"host {host} resolves to no IP address")
        if not allowed:
            refused = _address_of(found[0])
            raise UrlHostRefusedError(
                f"host {host} resolves to {refused}, {_with_article(address_kind(refused))} "
                f"address, which the worker's {_SETTING} ({self}) does not allow"
            )
        return allowed

    def _trusts(self, host: str) -> bool:
        """Whether ``host`` is a listed name or under a listed ``*.`` pattern."""
        name = _normal(host)
        return name in self._names or name.endswith(self._suffixes)


def address_kind(address: IpAddress) -> str:
    """What an address is, as a refusal names it: ``public``, ``loopback``, ``link-local``
    (``link-local (cloud metadata)``), ``private``, ``unspecified``, ``multicast`` or
    ``special-purpose`` (shared, documentation, reserved, ...)."""
    address = _unmapped(address)
    if address.is_unspecified:
        return "unspecified"
    if address.is_loopback:
        return "loopback"
    if address.is_link_local:
        return "link-local (cloud metadata)" if address in _METADATA else "link-local"
    if address.is_multicast:
        return "multicast"
    if any(address in network for network in _PRIVATE):
        return "private"
    return "public" if address.is_global else "special-purpose"


def _normal(host: str) -> str:
    """A host or entry as compared: lower case, without a final dot or IPv6 brackets."""
    return host.strip().lower().rstrip(".").removeprefix("[").removesuffix("]")


def _literal(host: str) -> IpAddress | None:
    try:
        return ipaddress.ip_address(_normal(host).partition("%")[0])
    except ValueError:
        return None


def _unmapped(address: IpAddress) -> IpAddress:
    """An IPv4-mapped IPv6 address (``::ffff:127.0.0.1``) as the IPv4 address it reaches."""
    if isinstance(address, ipaddress.IPv6Address) and address.ipv4_mapped is not None:
        return address.ipv4_mapped
    return address


def _address_of(item: ResolvedAddress) -> IpAddress:
    return ipaddress.ip_address(item.sockaddr[0].partition("%")[0])


def _with_article(kind: str) -> str:
    return ("an " if kind[0] in "aeiou" else "a ") + kind


PUBLIC_HOSTS = UrlHostRule()
"""Public hosts only: a worker's default."""
ANY_HOST = UrlHostRule((_ANY,))
"""Anything: localrun's rule."""
