"""Where URL bindings may point (the worker's ``url_binding_hosts``): the rule at create and
update, the address a name resolves to at each request, and the setting itself."""

from __future__ import annotations

import datetime
import ipaddress
import json
import re
import ssl
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from cryptography import x509
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import ec
from cryptography.x509.oid import NameOID

from magnetar.instance.javascript._curl import UrlClient
from magnetar.instance.secrets import ClearTextSecretsProvider
from magnetar.instance.url_bindings import UrlBinding
from magnetar.instance.url_hosts import (
    ANY_HOST,
    PUBLIC_HOSTS,
    UrlHostRefusedError,
    UrlHostRule,
    address_kind,
)
from magnetar.worker.config import load_worker_config
from magnetar.worker.exceptions import WorkerConfigError
from tests.http_endpoint import Server, http_endpoint
from tests.unit.test_javascript import executor, outputs

LOCAL = UrlHostRule(("public", "127.0.0.1"))
"""A worker's setting that lets bindings reach the test's servers (on 127.0.0.1)."""


@pytest.fixture
def server() -> Iterator[Server]:
    with http_endpoint() as endpoint:
        yield endpoint


@pytest.mark.parametrize(
    ("address", "kind"),
    [
        ("8.8.8.8", "public"),
        ("2001:4860:4860::8888", "public"),
        ("127.0.0.1", "loopback"),
        ("127.8.9.10", "loopback"),
        ("::1", "loopback"),
        ("::ffff:127.0.0.1", "loopback"),  # IPv4-mapped: what it reaches
        ("169.254.169.254", "link-local (cloud metadata)"),
        ("169.254.1.1", "link-local"),
        ("fe80::1", "link-local"),
        ("10.1.2.3", "private"),
        ("172.16.0.1", "private"),
        ("192.168.1.1", "private"),
        ("fd12::1", "private"),
        ("0.0.0.0", "unspecified"),
        ("::", "unspecified"),
        ("224.0.0.1", "multicast"),
        ("ff02::1", "multicast"),
        ("100.64.0.1", "special-purpose"),  # shared (carrier-grade NAT)
        ("192.0.2.1", "special-purpose"),  # documentation
    ],
)
def test_addresses_by_kind(address: str, kind: str) -> None:
    ip = ipaddress.ip_address(address)
    assert address_kind(ip) == kind
    assert PUBLIC_HOSTS.allows_address(ip) == (kind == "public")
    assert ANY_HOST.allows_address(ip)


def refusal(rule: UrlHostRule, host: str) -> str | None:
    try:
        rule.check_binding(host)
    except UrlHostRefusedError as error:
        return str(error)
    return None


def test_the_default_refuses_internal_addresses_and_leaves_names_to_their_resolution() -> None:
    assert refusal(PUBLIC_HOSTS, "127.0.0.1") == (
        "host 127.0.0.1 is a loopback address, which the worker's url_binding_hosts (public) "
        "does not allow"
    )
    assert refusal(PUBLIC_HOSTS, "169.254.169.254") == (
        "host 169.254.169.254 is a link-local (cloud metadata) address, which the worker's "
        "url_binding_hosts (public) does not allow"
    )
    assert "host ::1 is a loopback address" in (refusal(PUBLIC_HOSTS, "::1") or "")
    assert "host 10.0.0.5 is a private address" in (refusal(PUBLIC_HOSTS, "10.0.0.5") or "")
    assert refusal(PUBLIC_HOSTS, "93.184.215.14") is None
    # a name is checked where it resolves, at each request
    assert refusal(PUBLIC_HOSTS, "api.example.com") is None
    assert refusal(PUBLIC_HOSTS, "localhost") is None


@pytest.mark.parametrize(
    ("entries", "host", "allowed"),
    [
        (("public", "127.0.0.1"), "127.0.0.1", True),
        (("public", "127.0.0.0/8"), "127.0.0.2", True),
        (("public", "10.0.0.0/8"), "169.254.169.254", False),
        (("public", "fd00::/8"), "fd00::5", True),
        (("127.0.0.0/8",), "::ffff:127.0.0.1", True),
        (("*.svc.example",), "db.svc.example", True),
        (("*.svc.example",), "DB.Svc.Example.", True),  # case and a final dot
        (("*.svc.example",), "svc.example", False),  # under it, not the domain itself
        (("*.svc.example",), "api.example.com", False),  # only listed names
        (("*.svc.example",), "10.0.0.1", False),
        (("api.example.com",), "api.example.com", True),
        (("api.example.com",), "www.example.com", False),
        (("*",), "169.254.169.254", True),
        ((), "api.example.com", False),  # nothing listed: no binding at all
    ],
)
def test_listed_hosts(entries: tuple[str, ...], host: str, allowed: bool) -> None:
    assert (refusal(UrlHostRule(entries), host) is None) == allowed


def test_a_name_is_checked_by_the_address_it_resolves_to() -> None:
    # localhost resolves to loopback everywhere (RFC 6761): a public-looking binding is not
    # enough, its address decides
    with pytest.raises(UrlHostRefusedError) as refused:
        PUBLIC_HOSTS.resolve("localhost", 80)
    assert re.fullmatch(
        r"host localhost resolves to (127\.0\.0\.1|::1), a loopback address, which the "
        r"worker's url_binding_hosts \(public\) does not allow",
        str(refused.value),
    )
    # a listed range lets the name through, to the addresses in it only
    in_range = UrlHostRule(("public", "127.0.0.0/8")).resolve("localhost", 80)
    assert {item.sockaddr[:2] for item in in_range} == {("127.0.0.1", 80)}
    # a listed name is the operator's: whatever it resolves to
    named = UrlHostRule(("public", "localhost")).resolve("localhost", 80)
    assert ("127.0.0.1", 80) in {item.sockaddr[:2] for item in named}


def test_the_setting_from_the_environment_and_its_mistakes(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    assert load_worker_config().url_binding_hosts == ("public",)
    monkeypatch.setenv("MAGNETAR_URL_BINDING_HOSTS", "public, 10.0.0.0/8,*.svc.example")
    assert load_worker_config().url_binding_hosts == ("public", "10.0.0.0/8", "*.svc.example")
    file = tmp_path / "worker.yaml"
    file.write_text("url_binding_hosts: [api.example.com, 'fd00::/8']\n")
    monkeypatch.delenv("MAGNETAR_URL_BINDING_HOSTS")
    assert load_worker_config(file).url_binding_hosts == ("api.example.com", "fd00::/8")
    monkeypatch.setenv("MAGNETAR_URL_BINDING_HOSTS", "public,http://api.example.com")
    with pytest.raises(WorkerConfigError) as caught:
        load_worker_config()
    assert "url_binding_hosts" in str(caught.value)
    assert (
        "'http://api.example.com' is no host name, *.domain pattern, IP address or address "
        "range (CIDR), nor 'public' or '*'"
    ) in str(caught.value)


# --- at each request ----------------------------------------------------------------------


SCRIPT = """
function process(input) {
  try { return curl('GET', api, {path: input}).body.host; }
  catch (e) { return e.name + ': ' + e.message; }
}
"""


def test_a_request_goes_only_to_an_allowed_address_with_the_name_as_host(
    tmp_path: Path, server: Server
) -> None:
    port = server.base.rpartition(":")[2]
    binding = [{"alias": "api", "url": f"http://localhost:{port}/api"}]
    refused = executor(tmp_path, SCRIPT, urlBindings=binding)  # the worker's default
    [answer] = outputs(refused, ["x"])
    assert re.fullmatch(
        r"CurlError: curl GET api x: host localhost resolves to (127\.0\.0\.1|::1), a "
        r"loopback address, which the worker's url_binding_hosts \(public\) does not allow",
        answer,
    )
    refused.close()
    assert server.seen.paths() == []
    for entries in (("public", "127.0.0.0/8"), ("public", "localhost")):
        allowed = executor(tmp_path, SCRIPT, url_hosts=UrlHostRule(entries), urlBindings=binding)
        # connected to the checked address, the request still names the host
        assert outputs(allowed, ["x"]) == [f"localhost:{port}"]
        allowed.close()
    assert server.seen.paths() == ["/api/x", "/api/x"]


def test_https_to_the_checked_address_verifies_the_host_name(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    cert, key = self_signed(tmp_path, "localhost")
    monkeypatch.setenv("SSL_CERT_FILE", str(cert))  # the client trusts it
    context = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
    context.load_cert_chain(cert, key)
    with http_endpoint(context) as server:
        port = server.base.rpartition(":")[2]

        def get(url: str) -> dict[str, Any]:
            binding = UrlBinding(alias="api", url=url)
            client = UrlClient([binding], {}, ClearTextSecretsProvider(), LOCAL)
            return client.answer({"method": "GET", "binding": "api", "path": "x"})

        # connected to 127.0.0.1, the certificate is checked for localhost, the Host header
        # names it
        answer = get(f"https://localhost:{port}/api")
        assert answer["status"] == 200
        assert json.loads(answer["body"])["host"] == f"localhost:{port}"
        # the same server by its address: the certificate is not 127.0.0.1's
        assert get(f"https://127.0.0.1:{port}/api")["error"] == (
            f"curl GET api x: TLS with 127.0.0.1:{port} failed: CERTIFICATE_VERIFY_FAILED"
        )


def self_signed(directory: Path, name: str) -> tuple[Path, Path]:
    """A certificate for ``name`` and its key, as PEM files."""
    key = ec.generate_private_key(ec.SECP256R1())
    subject = x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, name)])
    now = datetime.datetime.now(datetime.UTC)
    certificate = (
        x509.CertificateBuilder()
        .subject_name(subject)
        .issuer_name(subject)
        .public_key(key.public_key())
        .serial_number(x509.random_serial_number())
        .not_valid_before(now - datetime.timedelta(minutes=1))
        .not_valid_after(now + datetime.timedelta(hours=1))
        .add_extension(x509.SubjectAlternativeName([x509.DNSName(name)]), critical=False)
        .add_extension(x509.BasicConstraints(ca=True, path_length=None), critical=True)
        .sign(key, hashes.SHA256())
    )
    cert_path, key_path = directory / "cert.pem", directory / "key.pem"
    cert_path.write_bytes(certificate.public_bytes(serialization.Encoding.PEM))
    key_path.write_bytes(
        key.private_bytes(
            serialization.Encoding.PEM,
            serialization.PrivateFormat.PKCS8,
            serialization.NoEncryption(),
        )
    )
    return cert_path, key_path
