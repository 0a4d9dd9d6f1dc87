"""The egress policy: which hosts a URL may name, and which addresses a connection may reach.

Two checks at two moments:

- `EgressPolicy.check_url`, before a request (and each redirect hop) is sent: http/https only, and
  the host and port must be on the allow-list (`TOOLWORKER_EGRESS_ALLOW`). Names match name entries;
  an IP literal, in any form a resolver accepts (`2130706433`, `0x7f000001`, `127.1`,
  `[::ffff:127.0.0.1]`), is reduced to its real address first and matches IP/CIDR entries.
- `EgressPolicy.check_address`, when a socket is about to connect, on the address actually used:
  loopback, private, link-local, cloud metadata, CGNAT, multicast, unspecified, reserved and
  documentation ranges are refused, also when wrapped in an IPv6 form (mapped, compatible, SIIT,
  6to4, NAT64). Because it runs on every connection attempt, DNS rebinding does not get past it.

A host-name entry allows the NAME, not whatever it resolves to: if `intranet.example.com` resolves
to 10.1.2.3 the connection is refused unless an IP/CIDR entry names that address too. An IP/CIDR
entry lifts a refusal only when it lies inside the refused range (`10.0.0.0/8`, `127.0.0.1`), so a
broad entry such as `0.0.0.0/0` opens public addresses but never private ones, and the metadata
endpoints must be listed address by address.

Allow-list syntax, comma or whitespace separated, each entry with an optional `:port` (no port
means any port): `api.example.com`, `*.example.com` (subdomains only), `*` (any host; the address
rules still apply), `203.0.113.7`, `10.0.0.0/8`, `fd00::/8`, `[::1]:8080`, `127.0.0.1:9000`.

aiohttp hook: `make_connector` installs `EgressPolicy.socket_factory`, which raises `EgressDenied`
(an `OSError`) for a refused address. aiohttp wraps it in `ClientConnectorError`; `egress_error`
finds it again and turns it into `EgressBlocked`.
"""

from __future__ import annotations

import errno
import ipaddress
import re
import socket
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

import aiohttp
from aiohappyeyeballs import AddrInfoType
from yarl import URL

from worker.errors import CallbackRefused, EgressBlocked, MalformedURL, ToolError

IPAddress = ipaddress.IPv4Address | ipaddress.IPv6Address
IPNetwork = ipaddress.IPv4Network | ipaddress.IPv6Network

DENIED = "blocked by the egress policy"
LOOPBACK = "loopback address"
PRIVATE = "private address range"
LINK_LOCAL = "link-local address"
METADATA = "cloud metadata endpoint"
SHARED = "shared address space (CGNAT)"
MULTICAST = "multicast address"
UNSPECIFIED = "unspecified address"
BROADCAST = "broadcast address"
DOCUMENTATION = "documentation address range"
RESERVED = "reserved address range"
UNRECOGNISED = "unrecognised address"
REASONS = (
    LOOPBACK,
    PRIVATE,
    LINK_LOCAL,
    METADATA,
    SHARED,
    MULTICAST,
    UNSPECIFIED,
    BROADCAST,
    DOCUMENTATION,
    RESERVED,
    UNRECOGNISED,
)

# Most specific first: the first range that holds an address names the rule, and only an entry
# inside that range lifts it (so listing 169.254.0.0/16 does not open the metadata endpoint).
_BLOCKED: tuple[tuple[IPNetwork, str], ...] = tuple(
    (ipaddress.ip_network(cidr), reason)
    for cidr, reason in (
        ("169.254.169.254/32", METADATA),  # AWS, GCP, Azure, OpenStack, ...
        ("169.254.170.2/32", METADATA),  # AWS ECS task credentials
        ("100.100.100.200/32", METADATA),  # Alibaba Cloud
        ("fd00:ec2::254/128", METADATA),  # AWS over IPv6
        ("0.0.0.0/8", UNSPECIFIED),
        ("127.0.0.0/8", LOOPBACK),
        ("10.0.0.0/8", PRIVATE),
        ("172.16.0.0/12", PRIVATE),
        ("192.168.0.0/16", PRIVATE),
        ("100.64.0.0/10", SHARED),
        ("169.254.0.0/16", LINK_LOCAL),
        ("192.0.0.0/24", RESERVED),
        ("192.0.2.0/24", DOCUMENTATION),
        ("198.51.100.0/24", DOCUMENTATION),
        ("203.0.113.0/24", DOCUMENTATION),
        ("198.18.0.0/15", RESERVED),
        ("192.88.99.0/24", RESERVED),
        ("224.0.0.0/4", MULTICAST),
        ("255.255.255.255/32", BROADCAST),
        ("240.0.0.0/4", RESERVED),
        ("::/128", UNSPECIFIED),
        ("::1/128", LOOPBACK),
        ("fc00::/7", PRIVATE),
        ("fe80::/10", LINK_LOCAL),
        ("fec0::/10", RESERVED),
        ("ff00::/8", MULTICAST),
        ("2001:db8::/32", DOCUMENTATION),
        ("3fff::/20", DOCUMENTATION),
        ("100::/64", RESERVED),
        ("2001::/23", RESERVED),  # Teredo and other IETF assignments
        ("64:ff9b:1::/48", RESERVED),  # local-use NAT64: where the IPv4 sits depends on the prefix length
    )
)
_V4_MAPPED = ipaddress.ip_network("::ffff:0:0/96")
_V4_TRANSLATED = ipaddress.ip_network("::ffff:0:0:0/96")
_V4_COMPATIBLE = ipaddress.ip_network("::/96")
_NAT64 = ipaddress.ip_network("64:ff9b::/96")
_SIX_TO_FOUR = ipaddress.ip_network("2002::/16")

_SEPARATORS = re.compile(r"[\s,]+")
_BRACKETED = re.compile(r"\[([^\]]+)\](?::([^:]*))?")
_HOST_NAME = re.compile(r"(?=.{1,253}$)[a-z0-9_][a-z0-9_-]{0,62}(\.[a-z0-9_][a-z0-9_-]{0,62})*")
_IPV4_PART = re.compile(r"0[xX][0-9a-fA-F]*|0[0-7]*|[1-9][0-9]*")
_DNS_CACHE_TTL_S = 60
_CHAIN_LIMIT = 16


class EgressDenied(OSError):
    """Raised by the socket factory: aiohttp treats it as a failed connection attempt."""

    def __init__(self, reason: str) -> None:
        # EACCES keeps the errno when aiohappyeyeballs merges several refused attempts.
        super().__init__(errno.EACCES, f"{DENIED}: {reason}")
        self.reason = reason


@dataclass(frozen=True, slots=True)
class HostEntry:
    """An allow-list entry naming a host: exact, `.suffix` for `*.suffix`, or `*` for any."""

    pattern: str
    port: int | None = None

    def matches(self, host: str, port: int) -> bool:
        if self.port is not None and self.port != port:
            return False
        if self.pattern == "*":
            return True
        return host.endswith(self.pattern) if self.pattern.startswith(".") else host == self.pattern


@dataclass(frozen=True, slots=True)
class NetworkEntry:
    """An allow-list entry naming an address or a CIDR."""

    network: IPNetwork
    port: int | None = None

    def matches(self, address: IPAddress, port: int) -> bool:
        return (self.port is None or self.port == port) and address in self.network


@dataclass(frozen=True, slots=True)
class EgressPolicy:
    """The allow-list, and the address rules every connection is held to."""

    hosts: tuple[HostEntry, ...] = ()
    networks: tuple[NetworkEntry, ...] = ()

    @classmethod
    def parse(cls, text: str) -> EgressPolicy:
        """Read `TOOLWORKER_EGRESS_ALLOW`; a bad entry raises ValueError naming it."""
        entries = [parse_entry(token) for token in _SEPARATORS.split(text) if token]
        return cls(
            hosts=tuple(e for e in entries if isinstance(e, HostEntry)),
            networks=tuple(e for e in entries if isinstance(e, NetworkEntry)),
        )

    @property
    def enabled(self) -> bool:
        return bool(self.hosts or self.networks)

    def check_url(self, url: str) -> None:
        """Refuse a URL whose scheme, host or port the allow-list does not allow."""
        host, port = _host_and_port(url)
        address = literal_address(host)
        if address is None:
            self._check_name(host, port)
        else:
            self._check_literal(address, host, port)

    def check_address(self, ip: str, port: int, host: str | None = None) -> None:
        """Refuse connecting to a resolved address in a blocked range the allow-list does not name."""
        reason = self.refusal(ip, port)
        if reason is not None:
            raise EgressBlocked(blocked_message(reason, host, port))

    def refusal(self, ip: str, port: int) -> str | None:
        """The rule that refuses this address, None when it may be reached."""
        try:
            address = unwrap(ipaddress.ip_address(ip))
        except ValueError:
            return UNRECOGNISED
        blocked = blocked_range(address)
        if blocked is None:
            return None
        network, reason = blocked
        return None if self._lifts(address, network, port) else reason

    def socket_factory(self, addr_info: AddrInfoType) -> socket.socket:
        """aiohappyeyeballs' SocketFactoryType: check the address of each connection attempt first."""
        family, type_, proto, _, sockaddr = addr_info
        reason = self.refusal(str(sockaddr[0]), int(sockaddr[1]))
        if reason is not None:
            raise EgressDenied(reason)
        return socket.socket(family=family, type=type_, proto=proto)

    def _lifts(self, address: IPAddress, blocked: IPNetwork, port: int) -> bool:
        return any(_within(entry.network, blocked) and entry.matches(address, port) for entry in self.networks)

    def _check_name(self, host: str, port: int) -> None:
        if not _HOST_NAME.fullmatch(host):
            raise MalformedURL(f"The URL's host {host[:253]!r} is not a valid host name or IP address.")
        if not any(entry.matches(host, port) for entry in self.hosts):
            raise EgressBlocked(self._not_listed(host, port))

    def _check_literal(self, address: IPAddress, host: str, port: int) -> None:
        forms = {address, unwrap(address)}
        listed = any(entry.matches(form, port) for entry in self.networks for form in forms) or any(
            entry.pattern == "*" and entry.matches(host, port) for entry in self.hosts
        )
        if not listed:
            raise EgressBlocked(self._not_listed(host, port))
        self.check_address(str(address), port, host)

    def _not_listed(self, host: str, port: int) -> str:
        if not self.enabled:
            return "No host may be requested: the egress allow-list (TOOLWORKER_EGRESS_ALLOW) is empty."
        return f"The request to {_display(host)}:{port} was {DENIED}: the host is not on the allow-list."


def parse_entry(token: str) -> HostEntry | NetworkEntry:
    """One allow-list entry: a host name, `*.domain`, `*`, an IP address or a CIDR, with an optional port."""
    if "://" in token:
        raise ValueError(f"Egress allow-list entry {token!r}: write the host (and :port), not a URL.")
    target, port, bracketed = _split_port(token)
    network = _entry_network(target, token)
    if network is not None:
        return NetworkEntry(network, port)
    if bracketed:
        raise ValueError(f"Egress allow-list entry {token!r}: brackets must hold an IPv6 address or CIDR.")
    return HostEntry(_host_pattern(target, token), port)


def _split_port(token: str) -> tuple[str, int | None, bool]:
    if token.startswith("["):
        match = _BRACKETED.fullmatch(token)
        if match is None:
            raise ValueError(f"Egress allow-list entry {token!r}: expected [address] or [address]:port.")
        return match[1], _entry_port(match[2], token), True
    if token.count(":") > 1:  # a bare IPv6 address or CIDR; a port needs brackets
        return token, None, False
    target, colon, port = token.partition(":")
    return target, _entry_port(port if colon else None, token), False


def _entry_port(text: str | None, token: str) -> int | None:
    if text is None:
        return None
    if not text.isascii() or not text.isdigit() or not 1 <= int(text) <= 65535:
        raise ValueError(f"Egress allow-list entry {token!r}: the port must be a number from 1 to 65535.")
    return int(text)


def _within(network: IPNetwork, outer: IPNetwork) -> bool:
    """`network` lies inside `outer` (never, across IP versions)."""
    if isinstance(network, ipaddress.IPv4Network) and isinstance(outer, ipaddress.IPv4Network):
        return network.subnet_of(outer)
    if isinstance(network, ipaddress.IPv6Network) and isinstance(outer, ipaddress.IPv6Network):
        return network.subnet_of(outer)
    return False


def _entry_network(target: str, token: str) -> IPNetwork | None:
    if "/" in target:
        try:
            return ipaddress.ip_network(target)
        except ValueError as exc:
            raise ValueError(f"Egress allow-list entry {token!r} is not a valid CIDR: {exc}.") from None
    address = literal_address(target.lower())
    return None if address is None else ipaddress.ip_network(unwrap(address))


def _host_pattern(target: str, token: str) -> str:
    if target == "*":
        return "*"
    wildcard = target.startswith("*.")
    name = _normal_host(target[2:] if wildcard else target)
    if name is None or not _HOST_NAME.fullmatch(name):
        raise ValueError(
            f"Egress allow-list entry {token!r} is not a host name, *.domain, IP address or CIDR"
            " (optionally with :port)."
        )
    return "." + name if wildcard else name


def _normal_host(name: str) -> str | None:
    """Lower case, IDNA-encoded, without trailing dots: the form yarl gives a URL's host."""
    try:
        raw = URL.build(scheme="http", host=name).raw_host
    except ValueError:
        return None
    return raw.rstrip(".") if raw else None


def _host_and_port(url: str) -> tuple[str, int]:
    try:
        parsed = URL(url)
    except (ValueError, TypeError) as exc:
        raise MalformedURL(f"The URL is malformed: {exc}.") from None
    if not parsed.scheme:
        raise MalformedURL("The URL must be absolute, starting with http:// or https://.")
    if parsed.scheme not in {"http", "https"}:
        raise EgressBlocked(f"Only http:// and https:// URLs may be requested, not {parsed.scheme[:32]!r}.")
    host = (parsed.raw_host or "").rstrip(".")
    if not host:
        raise MalformedURL("The URL has no host.")
    if not parsed.port:
        raise MalformedURL("The URL's port must be from 1 to 65535.")
    return host, parsed.port


def literal_address(host: str) -> IPAddress | None:
    """The address an IP literal means to a resolver, in any form it accepts; None for a name."""
    if ":" in host:
        try:
            return ipaddress.IPv6Address(host.strip("[]").replace("%25", "%"))
        except ValueError:
            return None
    return _inet_aton(host)


def _inet_aton(host: str) -> ipaddress.IPv4Address | None:
    """IPv4 as inet_aton(3) reads it: 1 to 4 parts, each decimal, octal (0…) or hex (0x…)."""
    parts = host.split(".")
    if not 1 <= len(parts) <= 4 or not all(_IPV4_PART.fullmatch(part) for part in parts):
        return None
    values = [_aton_part(part) for part in parts]
    *leading, last = values
    if any(value > 255 for value in leading) or last >= 256 ** (5 - len(values)):
        return None
    number = last
    for index, value in enumerate(leading):
        number += value << (24 - 8 * index)
    return ipaddress.IPv4Address(number)


def _aton_part(part: str) -> int:
    if part[:2].lower() == "0x":
        return int(part[2:] or "0", 16)
    if part.startswith("0"):
        return int(part, 8)
    return int(part)


def unwrap(address: IPAddress) -> IPAddress:
    """The IPv4 address inside an IPv6 form that carries one (mapped, translated, compatible, NAT64, 6to4)."""
    if isinstance(address, ipaddress.IPv4Address):
        return address
    if address.sixtofour is not None:
        return address.sixtofour
    embedded = ipaddress.IPv4Address(int(address) & 0xFFFFFFFF)
    if address in _V4_MAPPED or address in _V4_TRANSLATED or address in _NAT64:
        return embedded
    # :: and ::1 sit inside the compatible range but are IPv6's own unspecified and loopback.
    if address in _V4_COMPATIBLE and int(address) > 1:
        return embedded
    return address


def blocked_range(address: IPAddress) -> tuple[IPNetwork, str] | None:
    """The most specific blocked range holding an (unwrapped) address, None for a global one."""
    for network, reason in _BLOCKED:
        if address in network:
            return network, reason
    if not address.is_global:  # ranges the table above does not name yet
        return ipaddress.ip_network(address), RESERVED
    return None


def blocked_message(reason: str, host: str | None = None, port: int | None = None) -> str:
    """The refusal as the model reads it: the rule, and the host it asked for, never the address."""
    if host is None:
        return f"The connection was {DENIED}: {reason}."
    return f"Connecting to {_display(host)}:{port} was {DENIED}: {reason}."


def _display(host: str) -> str:
    return f"[{host}]" if ":" in host else host


def make_connector(
    policy: EgressPolicy, connector: type[aiohttp.TCPConnector] = aiohttp.TCPConnector, **kwargs: Any
) -> aiohttp.TCPConnector:
    """A TCPConnector (of the class given) that checks every connection attempt against the policy; call it
    on the running loop."""
    if "socket_factory" in kwargs:
        raise TypeError("make_connector installs the egress policy's own socket_factory.")
    options: dict[str, Any] = {"ttl_dns_cache": _DNS_CACHE_TTL_S, **kwargs}
    return connector(socket_factory=policy.socket_factory, **options)


def egress_error(exc: BaseException) -> EgressBlocked | None:
    """The EgressBlocked behind an aiohttp connection error, None when the policy did not refuse it."""
    chain = list(_exception_chain(exc))
    reason = _refusal_reason(chain)
    if reason is None:
        return None
    target = next((e for e in chain if isinstance(e, aiohttp.ClientConnectorError)), None)
    if target is None:
        return EgressBlocked(blocked_message(reason))
    return EgressBlocked(blocked_message(reason, target.host, target.port))


def _refusal_reason(chain: list[BaseException]) -> str | None:
    for error in chain:
        if isinstance(error, EgressDenied):
            return error.reason
    # aiohappyeyeballs merges the failures of several addresses into one OSError's text.
    for error in chain:
        text = str(error)
        for reason in REASONS:
            if f"{DENIED}: {reason}" in text:
                return reason
    return None


def _exception_chain(exc: BaseException) -> Iterator[BaseException]:
    seen: set[int] = set()
    pending: list[BaseException | None] = [exc]
    while pending and len(seen) < _CHAIN_LIMIT:
        error = pending.pop()
        if error is None or id(error) in seen:
            continue
        seen.add(id(error))
        yield error
        pending.extend([error.__context__, error.__cause__, getattr(error, "os_error", None)])


def check_callback(policy: EgressPolicy, url: str) -> None:
    """Refuse a callback URL the callback allow-list (`policy`) does not allow (raises CallbackRefused)."""
    if not policy.enabled:
        raise CallbackRefused("Callbacks are off: TOOLWORKER_CALLBACK_ALLOW is empty, so no callback URL is allowed.")
    try:
        policy.check_url(url)
    except ToolError as exc:
        raise CallbackRefused(f"The callback URL is refused: {exc.message}") from None
