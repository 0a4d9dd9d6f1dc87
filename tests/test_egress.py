"""The egress policy: allow-list parsing, URL and address rules, and the aiohttp connect-time hook.

Address rules are unit-tested on strings, without connecting. The end-to-end tests connect only to
a local server on 127.0.0.1; refused addresses are refused before any socket exists.
"""

from __future__ import annotations

import errno
import ipaddress
import re
import socket
from collections.abc import AsyncIterator, Sequence

import aiohttp
import pytest
from aiohttp import web
from aiohttp.abc import AbstractResolver, ResolveResult
from hypothesis import given
from hypothesis import strategies as st

from worker.errors import EgressBlocked, MalformedURL
from worker.http.egress import (
    DENIED,
    LINK_LOCAL,
    LOOPBACK,
    METADATA,
    MULTICAST,
    PRIVATE,
    EgressDenied,
    EgressPolicy,
    HostEntry,
    NetworkEntry,
    egress_error,
    literal_address,
    make_connector,
    unwrap,
)

DEFAULT = EgressPolicy.parse("*")
net = ipaddress.ip_network


# --- the allow-list ----------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        ("api.example.com", HostEntry("api.example.com")),
        ("API.Example.COM.", HostEntry("api.example.com")),
        ("api.example.com:8443", HostEntry("api.example.com", 8443)),
        ("*.example.com", HostEntry(".example.com")),
        ("*.example.com:443", HostEntry(".example.com", 443)),
        ("*", HostEntry("*")),
        ("bücher.example", HostEntry("xn--bcher-kva.example")),
        ("internal_svc", HostEntry("internal_svc")),
        ("127.0.0.1:9000", NetworkEntry(net("127.0.0.1/32"), 9000)),
        ("203.0.113.7", NetworkEntry(net("203.0.113.7/32"))),
        ("10.0.0.0/8", NetworkEntry(net("10.0.0.0/8"))),
        ("fd00::/8", NetworkEntry(net("fd00::/8"))),
        ("::1", NetworkEntry(net("::1/128"))),
        ("[::1]:8080", NetworkEntry(net("::1/128"), 8080)),
        ("[fd00::/8]:443", NetworkEntry(net("fd00::/8"), 443)),
        ("[::ffff:127.0.0.1]", NetworkEntry(net("127.0.0.1/32"))),
        ("0x7f000001", NetworkEntry(net("127.0.0.1/32"))),
    ],
)
def test_parse_entry(text: str, expected: HostEntry | NetworkEntry) -> None:
    """Each entry form is read into its normalised host pattern or network, with its port."""
    policy = EgressPolicy.parse(text)
    assert (*policy.hosts, *policy.networks) == (expected,)


def test_parse_separators() -> None:
    """Entries may be separated by commas, spaces and newlines, in any mix."""
    policy = EgressPolicy.parse(" a.example.com,b.example.com\n\t10.0.0.0/8 ,, [::1]:80 ")
    assert [h.pattern for h in policy.hosts] == ["a.example.com", "b.example.com"]
    assert [str(n.network) for n in policy.networks] == ["10.0.0.0/8", "::1/128"]


@pytest.mark.parametrize("text", ["", "   ", " , ,\n"])
def test_empty_list_disables(text: str) -> None:
    """An empty allow-list leaves the policy disabled."""
    assert not EgressPolicy.parse(text).enabled


@pytest.mark.parametrize(
    ("text", "fragment"),
    [
        ("10.0.0.1/8", "host bits set"),
        ("10.0.0.0/33", "not a valid CIDR"),
        ("api.example.com:0", "port"),
        ("api.example.com:65536", "port"),
        ("api.example.com:http", "port"),
        ("[::1]:", "port"),
        ("[::1", "[address]"),
        ("[api.example.com]:80", "brackets"),
        ("a*.example.com", "not a host name"),
        ("*.", "not a host name"),
        ("-bad.example.com", "not a host name"),
        ("https://api.example.com", "not a URL"),
        ("a" * 64 + ".example.com", "not a host name"),
    ],
)
def test_parse_rejects(text: str, fragment: str) -> None:
    """An invalid entry raises ValueError naming the entry and what is wrong."""
    with pytest.raises(ValueError, match="Egress allow-list entry") as caught:
        EgressPolicy.parse(f"ok.example.com, {text}")
    assert fragment in str(caught.value)


# --- IP literal forms ----------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("host", "address"),
    [
        ("127.0.0.1", "127.0.0.1"),
        ("2130706433", "127.0.0.1"),
        ("017700000001", "127.0.0.1"),
        ("0177.0.0.1", "127.0.0.1"),
        ("0x7f000001", "127.0.0.1"),
        ("0X7F.0.0.1", "127.0.0.1"),
        ("0x7f.1", "127.0.0.1"),
        ("127.1", "127.0.0.1"),
        ("127.0.1", "127.0.0.1"),
        ("10.0.0.010", "10.0.0.8"),
        ("0", "0.0.0.0"),
        ("0xa9fea9fe", "169.254.169.254"),
        ("::1", "::1"),
        ("[::ffff:127.0.0.1]", "::ffff:7f00:1"),
        ("fe80::1%25eth0", "fe80::1%eth0"),
        ("api.example.com", None),
        ("1.2.3.4.5", None),
        ("08.0.0.1", None),
        ("256.0.0.1", None),
        ("1.2.3.256", None),
        ("1.2.65536", None),
        ("0x100000000", None),
        ("127.0.0.1.example.com", None),
    ],
)
def test_literal_address(host: str, address: str | None) -> None:
    """Any IPv4 form inet_aton accepts maps to its real address; names and impossible numbers do not."""
    expected = None if address is None else ipaddress.ip_address(address)
    assert literal_address(host) == expected


@pytest.mark.parametrize(
    ("wrapped", "inner"),
    [
        ("::ffff:127.0.0.1", "127.0.0.1"),
        ("::ffff:0:a00:1", "10.0.0.1"),
        ("::127.0.0.1", "127.0.0.1"),
        ("::a9fe:a9fe", "169.254.169.254"),
        ("64:ff9b::a00:1", "10.0.0.1"),
        ("2002:c0a8:101::1", "192.168.1.1"),
        ("::1", "::1"),
        ("::", "::"),
        ("2606:4700::1", "2606:4700::1"),
        ("8.8.8.8", "8.8.8.8"),
    ],
)
def test_unwrap(wrapped: str, inner: str) -> None:
    """IPv6 forms that carry an IPv4 address are reduced to it; other addresses stay as they are."""
    assert unwrap(ipaddress.ip_address(wrapped)) == ipaddress.ip_address(inner)


# --- check_address: the connect-time rules ---------------------------------------------------------


@pytest.mark.parametrize(
    ("ip", "reason"),
    [
        ("127.0.0.1", "loopback address"),
        ("127.0.0.2", "loopback address"),
        ("127.255.255.254", "loopback address"),
        ("::1", "loopback address"),
        ("::ffff:127.0.0.1", "loopback address"),
        ("::127.0.0.1", "loopback address"),
        ("::ffff:0:127.0.0.1", "loopback address"),
        ("64:ff9b::127.0.0.1", "loopback address"),
        ("2002:7f00:1::", "loopback address"),
        ("10.0.0.1", "private address range"),
        ("10.255.255.255", "private address range"),
        ("172.16.0.1", "private address range"),
        ("172.31.255.254", "private address range"),
        ("192.168.1.1", "private address range"),
        ("::ffff:10.0.0.1", "private address range"),
        ("::ffff:192.168.0.1", "private address range"),
        ("fc00::1", "private address range"),
        ("fd12:3456::1", "private address range"),
        ("169.254.169.254", "cloud metadata endpoint"),
        ("169.254.170.2", "cloud metadata endpoint"),
        ("100.100.100.200", "cloud metadata endpoint"),
        ("fd00:ec2::254", "cloud metadata endpoint"),
        ("::ffff:169.254.169.254", "cloud metadata endpoint"),
        ("::ffff:a9fe:a9fe", "cloud metadata endpoint"),
        ("169.254.0.1", "link-local address"),
        ("fe80::1", "link-local address"),
        ("fe80::1%eth0", "link-local address"),
        ("100.64.0.1", "shared address space (CGNAT)"),
        ("100.127.255.254", "shared address space (CGNAT)"),
        ("224.0.0.1", "multicast address"),
        ("239.255.255.250", "multicast address"),
        ("ff02::1", "multicast address"),
        ("0.0.0.0", "unspecified address"),
        ("0.1.2.3", "unspecified address"),
        ("::", "unspecified address"),
        ("::ffff:0.0.0.0", "unspecified address"),
        ("255.255.255.255", "broadcast address"),
        ("240.0.0.1", "reserved address range"),
        ("192.0.0.8", "reserved address range"),
        ("198.18.0.1", "reserved address range"),
        ("2001::1", "reserved address range"),
        ("64:ff9b:1::1", "reserved address range"),
        ("fec0::1", "reserved address range"),
        ("100::1", "reserved address range"),
        ("192.0.2.1", "documentation address range"),
        ("198.51.100.1", "documentation address range"),
        ("203.0.113.1", "documentation address range"),
        ("2001:db8::1", "documentation address range"),
        ("not-an-address", "unrecognised address"),
    ],
)
def test_check_address_refuses(ip: str, reason: str) -> None:
    """A non-global address, bare or wrapped in an IPv6 form, is refused with its rule named."""
    with pytest.raises(EgressBlocked, match=re.escape(f"{DENIED}: {reason}")) as caught:
        DEFAULT.check_address(ip, 443, "internal.example.com")
    assert caught.value.exit_code == 77
    assert ip not in caught.value.message
    assert "internal.example.com:443" in caught.value.message


@pytest.mark.parametrize(
    "ip",
    [
        "8.8.8.8",
        "1.1.1.1",
        "93.184.215.14",
        "100.63.255.255",
        "100.128.0.0",
        "172.32.0.1",
        "::ffff:8.8.8.8",
        "64:ff9b::808:808",
        "2002:808:808::1",
        "2606:4700:4700::1111",
        "2a00:1450:4001::200e",
    ],
)
def test_check_address_allows_global(ip: str) -> None:
    """Public addresses, also in their mapped, NAT64 or 6to4 forms, may be reached."""
    DEFAULT.check_address(ip, 443)


@pytest.mark.parametrize(
    ("allow", "ip", "port", "allowed"),
    [
        ("127.0.0.1", "127.0.0.1", 80, True),
        ("127.0.0.1", "::ffff:127.0.0.1", 80, True),
        ("127.0.0.1", "127.0.0.2", 80, False),
        ("127.0.0.1:9000", "127.0.0.1", 9000, True),
        ("127.0.0.1:9000", "127.0.0.1", 9001, False),
        ("127.0.0.0/8", "127.0.0.2", 80, True),
        ("[::1]:8080", "::1", 8080, True),
        ("10.0.0.0/8", "10.1.2.3", 443, True),
        ("10.1.0.0/16", "10.2.0.1", 443, False),
        ("fd00::/8", "fd12::1", 443, True),
        ("192.168.1.0/24", "192.168.1.20", 443, True),
        ("0.0.0.0/0", "10.0.0.1", 443, False),
        ("0.0.0.0/0", "127.0.0.1", 443, False),
        ("::/0", "::1", 443, False),
        ("8.0.0.0/7", "10.0.0.1", 443, False),
        ("169.254.0.0/16", "169.254.1.1", 80, True),
        ("169.254.0.0/16", "169.254.169.254", 80, False),
        ("169.254.169.254", "169.254.169.254", 80, True),
        ("fd00::/8", "fd00:ec2::254", 80, False),
        ("[fd00:ec2::254]", "fd00:ec2::254", 80, True),
        ("localhost", "127.0.0.1", 80, False),
        ("internal.example.com", "10.0.0.5", 443, False),
        ("*", "10.0.0.5", 443, False),
    ],
)
def test_allow_list_lifts_only_named_addresses(allow: str, ip: str, port: int, allowed: bool) -> None:
    """An IP/CIDR entry inside a refused range lifts the refusal; broad CIDRs and host names do not."""
    policy = EgressPolicy.parse(allow)
    assert (policy.refusal(ip, port) is None) is allowed


def test_check_address_message_without_host() -> None:
    """Without a host the message still names the rule and not the address."""
    with pytest.raises(EgressBlocked) as caught:
        DEFAULT.check_address("10.9.8.7", 80)
    assert caught.value.message == f"The connection was {DENIED}: {PRIVATE}."


@given(st.ip_addresses(v=4))
def test_wrapped_forms_agree(address: ipaddress.IPv4Address) -> None:
    """An IPv4 address and its mapped, NAT64 and 6to4 forms get the same decision."""
    plain = DEFAULT.refusal(str(address), 80)
    mapped = ipaddress.IPv6Address(f"::ffff:{address}")
    nat64 = ipaddress.IPv6Address(f"64:ff9b::{address}")
    six_to_four = ipaddress.IPv6Address((0x2002 << 112) | (int(address) << 80) | 1)
    assert {DEFAULT.refusal(str(form), 80) for form in (mapped, nat64, six_to_four)} == {plain}


@given(st.ip_addresses(v=4))
def test_decimal_form_agrees(address: ipaddress.IPv4Address) -> None:
    """The decimal and hexadecimal integer forms of an address read as the address itself."""
    assert literal_address(str(int(address))) == address
    assert literal_address(hex(int(address))) == address


# --- check_url: before the request -----------------------------------------------------------------

POLICY = EgressPolicy.parse(
    "api.example.com *.example.org:443 bücher.example 127.0.0.1:9000 [::1]:8080 10.0.0.0/8 203.0.113.0/24"
)


@pytest.mark.parametrize(
    "url",
    [
        "https://api.example.com/v1/items?q=1",
        "http://api.example.com:8080/",
        "https://API.EXAMPLE.COM./v1",
        "https://api.example.com../v1",
        "https://user:pw@api.example.com/",
        "https://a.example.org/",
        "https://a.b.example.org/x",
        "https://BÜCHER.example/",
        "https://xn--bcher-kva.example/",
        "http://127.0.0.1:9000/",
        "http://2130706433:9000/",
        "http://0x7f000001:9000/",
        "http://0177.0.0.1:9000/",
        "http://127.1:9000/",
        "http://[::ffff:127.0.0.1]:9000/",
        "http://[::1]:8080/",
        "http://10.1.2.3/",
        "http://012.1.2.3/",
        "http://203.0.113.5/",
    ],
)
def test_check_url_allows(url: str) -> None:
    """Listed names (any case, IDNA, trailing dot) and listed addresses in any literal form pass."""
    POLICY.check_url(url)


@pytest.mark.parametrize(
    "url",
    [
        "https://example.org/",
        "http://a.example.org/",
        "https://a.example.org:8443/",
        "https://evil-example.org/",
        "https://api.example.com.evil.com/",
        "https://api.example.com@evil.com/",
        "https://evil.com/?api.example.com",
        "https://example.com/",
        "http://127.0.0.1/",
        "http://127.0.0.2:9000/",
        "http://2130706434:9000/",
        "http://[::1]/",
        "http://[::ffff:127.0.0.1]/",
        "http://[::127.0.0.1]:80/",
        "http://169.254.169.254/latest/meta-data/",
        "http://0xa9fea9fe/",
        "http://[::ffff:a9fe:a9fe]/",
        "http://[fd00:ec2::254]/",
        "http://11.0.0.1/",
        "http://198.51.100.1/",
        "ftp://api.example.com/",
        "file:///etc/passwd",
        "gopher://api.example.com/",
        "javascript:alert(1)",
    ],
)
def test_check_url_refuses(url: str) -> None:
    """Unlisted names, ports and addresses, internal literals and other schemes are refused."""
    with pytest.raises(EgressBlocked):
        POLICY.check_url(url)


@pytest.mark.parametrize(
    "url",
    ["api.example.com/x", "/relative", "http:///path", "http://[::1/", "http://a%41.example.com/", "http://x.com:0/"],
)
def test_check_url_malformed(url: str) -> None:
    """A URL without a usable host or port is malformed (exit 3)."""
    with pytest.raises(MalformedURL):
        POLICY.check_url(url)


def test_check_url_literal_names_the_rule() -> None:
    """A listed CIDR does not open an internal literal: the address rule still applies before sending."""
    policy = EgressPolicy.parse("0.0.0.0/0")
    with pytest.raises(EgressBlocked, match=LINK_LOCAL):
        policy.check_url("http://169.254.1.1/")


def test_check_url_on_empty_list() -> None:
    """With an empty allow-list no URL passes, and the message says why."""
    with pytest.raises(EgressBlocked, match="TOOLWORKER_EGRESS_ALLOW"):
        EgressPolicy.parse("").check_url("https://api.example.com/")


# --- egress_error: recognising a refusal inside aiohttp's errors -------------------------------------


def _connector_error(os_error: OSError) -> aiohttp.ClientConnectorError:
    key = aiohttp.client_reqrep.ConnectionKey("rebind.test", 80, False, True, None, None, None)
    try:
        raise aiohttp.ClientConnectorError(key, os_error) from os_error
    except aiohttp.ClientConnectorError as exc:
        return exc


def test_egress_error_from_connector_error() -> None:
    """A refusal wrapped by aiohttp becomes EgressBlocked naming the host asked for and the rule."""
    error = egress_error(_connector_error(EgressDenied(LOOPBACK)))
    assert error is not None
    assert error.message == f"Connecting to rebind.test:80 was {DENIED}: {LOOPBACK}."


def test_egress_error_from_merged_attempts() -> None:
    """A refusal merged with other failures into one OSError text is still recognised."""
    merged = OSError(f"Multiple exceptions: {EgressDenied(MULTICAST)}, [Errno 111] Connect call failed")
    error = egress_error(_connector_error(merged))
    assert error is not None
    assert MULTICAST in error.message


@pytest.mark.parametrize(
    "exc",
    [
        OSError(errno.ECONNREFUSED, "Connect call failed"),
        aiohttp.ClientPayloadError("boom"),
        TimeoutError(),
    ],
)
def test_egress_error_ignores_other_failures(exc: BaseException) -> None:
    """Failures the policy did not cause are left to the transport's own mapping."""
    assert egress_error(exc) is None
    assert egress_error(_connector_error(OSError(errno.ECONNREFUSED, "refused"))) is None


def test_egress_denied_is_an_oserror() -> None:
    """The factory's refusal is an OSError with EACCES, the kind of failure aiohttp wraps."""
    denied = EgressDenied(METADATA)
    assert isinstance(denied, OSError)
    assert denied.errno == errno.EACCES
    assert denied.strerror == f"{DENIED}: {METADATA}"


def test_socket_factory_refuses_before_creating_a_socket() -> None:
    """The factory raises for a refused address and returns a socket for an allowed one."""
    addr_info = (socket.AF_INET, socket.SOCK_STREAM, socket.IPPROTO_TCP, "", ("169.254.169.254", 80))
    with pytest.raises(EgressDenied, match=METADATA):
        DEFAULT.socket_factory(addr_info)
    allowed = EgressPolicy.parse("127.0.0.1")
    with allowed.socket_factory((socket.AF_INET, socket.SOCK_STREAM, socket.IPPROTO_TCP, "", ("127.0.0.1", 1))) as sock:
        assert sock.family == socket.AF_INET


# --- end to end: aiohttp against a local server ------------------------------------------------------


class FakeResolver(AbstractResolver):
    """Answers each name from a script of loopback answers, one answer per lookup (the last repeats)."""

    def __init__(self, answers: dict[str, Sequence[Sequence[str]]]) -> None:
        self.answers = {host: list(script) for host, script in answers.items()}

    async def resolve(
        self, host: str, port: int = 0, family: socket.AddressFamily = socket.AF_INET
    ) -> list[ResolveResult]:
        script = self.answers[host]
        ips = script.pop(0) if len(script) > 1 else script[0]
        return [
            ResolveResult(
                hostname=host,
                host=ip,
                port=port,
                family=socket.AF_INET6 if ":" in ip else socket.AF_INET,
                proto=0,
                flags=socket.AI_NUMERICHOST,
            )
            for ip in ips
        ]

    async def close(self) -> None:
        return None


@pytest.fixture
async def server_port() -> AsyncIterator[int]:
    async def hello(request: web.Request) -> web.Response:
        return web.Response(text="hello")

    app = web.Application()
    app.router.add_get("/", hello)
    runner = web.AppRunner(app)
    await runner.setup()
    site = web.TCPSite(runner, "127.0.0.1", 0)
    await site.start()
    port: int = runner.addresses[0][1]
    yield port
    await runner.cleanup()


async def _get(policy: EgressPolicy, url: str, resolver: AbstractResolver | None = None) -> str:
    connector = make_connector(policy, resolver=resolver, use_dns_cache=False, force_close=True)
    timeout = aiohttp.ClientTimeout(total=5)
    async with (
        aiohttp.ClientSession(connector=connector, trust_env=False, timeout=timeout) as session,
        session.get(url, allow_redirects=False) as response,
    ):
        return await response.text()


async def _refusal(policy: EgressPolicy, url: str, resolver: AbstractResolver | None = None) -> EgressBlocked:
    with pytest.raises(aiohttp.ClientConnectorError) as caught:
        await _get(policy, url, resolver)
    error = egress_error(caught.value)
    assert error is not None
    return error


async def test_allow_listed_address_connects(server_port: int) -> None:
    """A policy that names 127.0.0.1 reaches the local server through the checking connector."""
    policy = EgressPolicy.parse("127.0.0.1")
    url = f"http://127.0.0.1:{server_port}/"
    policy.check_url(url)
    assert await _get(policy, url) == "hello"


async def test_allow_listed_cidr_with_port_connects(server_port: int) -> None:
    """A CIDR entry with the server's port is enough to connect."""
    policy = EgressPolicy.parse(f"127.0.0.0/8, [::1]:{server_port}")
    assert await _get(policy, f"http://127.0.0.1:{server_port}/") == "hello"


@pytest.mark.parametrize("host", ["127.0.0.1", "127.0.0.2", "[::ffff:127.0.0.1]", "[::1]", "[::127.0.0.1]"])
async def test_default_policy_refuses_loopback_at_connect(server_port: int, host: str) -> None:
    """Without an entry naming it, a loopback literal in any form is refused by the socket factory."""
    error = await _refusal(DEFAULT, f"http://{host}:{server_port}/")
    assert error.message.endswith(f"{DENIED}: {LOOPBACK}.")


async def test_allow_listed_name_resolving_to_loopback_is_refused(server_port: int) -> None:
    """A listed name whose address is internal is refused at connect time, and the address stays unsaid."""
    policy = EgressPolicy.parse("rebind.test")
    url = f"http://rebind.test:{server_port}/"
    policy.check_url(url)
    error = await _refusal(policy, url, FakeResolver({"rebind.test": [["127.0.0.1"]]}))
    assert error.message == f"Connecting to rebind.test:{server_port} was {DENIED}: {LOOPBACK}."
    assert "127.0.0.1" not in error.message


async def test_rebinding_is_caught_on_the_next_connection(server_port: int) -> None:
    """A resolver that changes its answer is checked again on every connection it is used for."""
    policy = EgressPolicy.parse("rebind.test, 127.0.0.1")
    resolver = FakeResolver({"rebind.test": [["127.0.0.1"], ["127.0.0.2"]]})
    connector = make_connector(policy, resolver=resolver, use_dns_cache=False, force_close=True)
    url = f"http://rebind.test:{server_port}/"
    async with aiohttp.ClientSession(connector=connector, trust_env=False) as session:
        async with session.get(url, timeout=aiohttp.ClientTimeout(total=5)) as first:
            assert await first.text() == "hello"
        with pytest.raises(aiohttp.ClientConnectorError) as caught:
            await session.get(url, timeout=aiohttp.ClientTimeout(total=5))
    assert egress_error(caught.value) is not None


async def test_each_resolved_address_is_checked(server_port: int) -> None:
    """A refused address among several is skipped and the allowed one is used."""
    policy = EgressPolicy.parse("rebind.test, 127.0.0.1")
    resolver = FakeResolver({"rebind.test": [["127.0.0.2", "::1", "127.0.0.1"]]})
    assert await _get(policy, f"http://rebind.test:{server_port}/", resolver) == "hello"


async def test_all_resolved_addresses_refused(server_port: int) -> None:
    """When every address a name resolves to is refused, the error is still recognised as egress."""
    resolver = FakeResolver({"rebind.test": [["127.0.0.2", "127.0.0.3", "::1"]]})
    error = await _refusal(EgressPolicy.parse("rebind.test"), f"http://rebind.test:{server_port}/", resolver)
    assert LOOPBACK in error.message


async def test_make_connector_keeps_its_factory() -> None:
    """The policy's socket factory cannot be replaced through make_connector's options."""
    with pytest.raises(TypeError, match="socket_factory"):
        make_connector(DEFAULT, socket_factory=None)
