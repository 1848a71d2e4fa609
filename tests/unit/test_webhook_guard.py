"""The SSRF guard on IPv6 forms that carry an IPv4 address, the allowed ports, what of a
receiver's error body is kept, and the URL as messages and logs may show it."""

from __future__ import annotations

import ipaddress

import pytest

from skiplock.dispatcher.dispatcher import ERROR_EXCERPT_CHARS, error_excerpt
from skiplock.engine.errors import ConfigError, InvalidInput, WebhookAddressRefused
from skiplock.engine.logs import scrub
from skiplock.engine.settings import Settings
from skiplock.engine.webhooks import DENIED_PORTS, AddressGuard, parse_ports, redacted

# the four forms the probe got through, and one of each IPv4-embedding prefix
IPV4_IN_IPV6 = [
    "::7f00:1",              # IPv4-compatible ::127.0.0.1
    "::ffff:0:7f00:1",       # SIIT ::ffff:0:127.0.0.1
    "64:ff9b:1::7f00:1",     # RFC 8215 local-use NAT64
    "fec0::1",               # site-local (deprecated)
    "::a9fe:a9fe",           # ::169.254.169.254
    "::ffff:0:a00:1",        # SIIT 10.0.0.1
    "64:ff9b::a9fe:a9fe",    # well-known NAT64 169.254.169.254
    "64:ff9b::7f00:1",
    "64:ff9b:1:ffff::808:808",  # anywhere in the local-use /48, even with a public IPv4 in it
    "2002:7f00:1::1",        # 6to4 of 127.0.0.1
    "2002:a00:1::",          # 6to4 of 10.0.0.1
    "2001:0:4136:e378:8000:63bf:80ff:fffe",  # Teredo, client 127.0.0.1 (inverted: 80ff:fffe)
    "2001:0:a00:1:8000:63bf:3fff:fdd2",      # Teredo via server 10.0.0.1
    "fec0:1234::5",
    "feff::1",               # the top of fec0::/10
]


@pytest.mark.parametrize("address", IPV4_IN_IPV6)
def test_ipv6_forms_of_internal_ipv4_addresses_are_refused(address):
    assert not AddressGuard().permitted(ipaddress.ip_address(address))


@pytest.mark.parametrize("url", ["http://[::7f00:1]/", "http://[::ffff:0:7f00:1]/", "http://[64:ff9b:1::7f00:1]/",
                                 "http://[fec0::1]/"])
def test_the_probes_urls_are_refused(url):
    with pytest.raises(WebhookAddressRefused, match="not a public address"):
        AddressGuard().resolve(url)


@pytest.mark.parametrize("address", [
    "64:ff9b::808:808",                        # NAT64 of 8.8.8.8
    "2002:808:808::1",                         # 6to4 of 8.8.8.8
    "2001:0:4136:e378:8000:63bf:f7f7:f7f7",    # Teredo: server 65.54.227.120, client 8.8.8.8
    "2606:4700:4700::1111",
])
def test_ipv6_forms_of_public_addresses_stay_permitted(address):
    assert AddressGuard().permitted(ipaddress.ip_address(address))


def test_an_allowed_network_admits_the_ipv4_inside_an_ipv6_form():
    guard = AddressGuard(["127.0.0.0/8"])
    assert guard.permitted(ipaddress.ip_address("::ffff:0:7f00:1"))
    assert guard.permitted(ipaddress.ip_address("64:ff9b::7f00:1"))
    assert not guard.permitted(ipaddress.ip_address("::ffff:0:a00:1"))


# newer than Python 3.11's is_global table, which counts them public
NEWER_SPECIAL = ["5f00::1", "5f00:ffff:ffff::1",  # SRv6 SIDs, 5f00::/16 (RFC 9602)
                 "3fff::1", "3fff:fff:ffff::1"]    # documentation, 3fff::/20 (RFC 9637)


@pytest.mark.parametrize("address", NEWER_SPECIAL)
def test_srv6_and_new_documentation_addresses_are_refused(address):
    assert not AddressGuard().permitted(ipaddress.ip_address(address))
    with pytest.raises(WebhookAddressRefused, match="not a public address"):
        AddressGuard().resolve(f"http://[{address}]/")


@pytest.mark.parametrize("address", ["5eff::1", "5f01::1", "3ffe:ffff::1", "3fff:1000::1"])
def test_the_neighbours_of_the_new_ranges_stay_as_they_were(address):
    # just outside 5f00::/16 and 3fff::/20: the refusal is those prefixes, not their whole /8
    assert AddressGuard().permitted(ipaddress.ip_address(address)) == ipaddress.ip_address(address).is_global


# ---- ports -----------------------------------------------------------------------------------------

@pytest.mark.parametrize("url", ["http://93.184.216.34:0/hook", "https://93.184.216.34:0/", "http://[2606:4700::1]:0/"])
def test_port_zero_is_refused_not_read_as_the_default(url):
    with pytest.raises(InvalidInput, match="port 0 is not a port"):
        AddressGuard.parse(url)
    with pytest.raises(InvalidInput, match=r":0/.*port 0"):  # the message shows the port given
        AddressGuard(allowed_ports=range(0, 65536)).resolve(url)


@pytest.mark.parametrize("port", sorted(DENIED_PORTS) + [22, 25, 1023])
def test_default_ports_refuse_service_ports(port):
    guard = AddressGuard(["127.0.0.0/8"])
    with pytest.raises(WebhookAddressRefused, match=f"port {port} is not allowed.*SKIPLOCK_WEBHOOK_ALLOWED_PORTS"):
        guard.resolve(f"http://127.0.0.1:{port}/hook")


@pytest.mark.parametrize("url", ["http://127.0.0.1/", "https://127.0.0.1/", "http://127.0.0.1:8080/",
                                 "http://127.0.0.1:65535/", "http://127.0.0.1:1024/"])
def test_default_ports_admit_web_ports(url):
    assert AddressGuard(["127.0.0.0/8"]).resolve(url).address == "127.0.0.1"


def test_allowed_ports_from_the_environment():
    settings = Settings.from_env({"SKIPLOCK_WEBHOOK_ALLOWED_PORTS": "443, 8000-8002"})
    assert settings.webhook_allowed_ports == {443, 8000, 8001, 8002}
    guard = AddressGuard.from_settings(settings.replace(webhook_allowed_networks=("127.0.0.0/8",)))
    assert guard.resolve("http://127.0.0.1:8001/").port == 8001
    with pytest.raises(WebhookAddressRefused):
        guard.resolve("http://127.0.0.1:80/")
    assert Settings.from_env({"SKIPLOCK_WEBHOOK_ALLOWED_PORTS": "5432"}).webhook_allowed_ports == {5432}


@pytest.mark.parametrize("text", ["http", "0", "70000", "90-80", ",", "1-2-3"])
def test_bad_allowed_ports_fail_naming_the_variable(text):
    with pytest.raises(InvalidInput, match="SKIPLOCK_WEBHOOK_ALLOWED_PORTS"):
        parse_ports(text)
    with pytest.raises(ConfigError, match="SKIPLOCK_WEBHOOK_ALLOWED_PORTS"):
        Settings.from_env({"SKIPLOCK_WEBHOOK_ALLOWED_PORTS": text})


# ---- what is kept and shown -----------------------------------------------------------------------

def test_error_excerpt_is_short_printable_and_one_line():
    body = b"<html>\r\n\x1b[31mred\x1b[0m\x00 " + b"secret-config-line " * 100
    excerpt = error_excerpt(body)
    assert len(excerpt) <= ERROR_EXCERPT_CHARS
    assert excerpt.isprintable() and "\n" not in excerpt and "\x1b" not in excerpt and "\x00" not in excerpt
    assert excerpt.startswith("<html> [31mred [0m secret-config-line")
    assert error_excerpt(b"") == "" and error_excerpt(b"\xff\xfe oops") == "\ufffd\ufffd oops"


@pytest.mark.parametrize("url, shown", [
    ("https://hooks.example.com/in?access_token=s3cr3t", "https://hooks.example.com/in?..."),
    ("http://user:pw@hooks.example.com:8080/x", "http://hooks.example.com:8080/x"),
    ("http://[2001:db8::1]:9000/a?b=c", "http://[2001:db8::1]:9000/a?..."),
    ("http://example.com:99999/", "(a malformed URL)"),
])
def test_redacted(url, shown):
    assert redacted(url) == shown


def test_refusals_do_not_quote_a_query_string_or_credentials():
    for url in ("http://127.0.0.1:5432/x?access_token=s3cr3t", "http://u:s3cr3t@127.0.0.1/x",
                "ftp://h/x?access_token=s3cr3t"):
        with pytest.raises(InvalidInput) as info:
            AddressGuard().resolve(url)
        assert "s3cr3t" not in str(info.value)


@pytest.mark.parametrize("line, scrubbed", [
    ('HTTP Request: POST http://127.0.0.1:8080/hook?access_token=s3cr3t "HTTP/1.1 200 OK"',
     'HTTP Request: POST http://127.0.0.1:8080/hook?... "HTTP/1.1 200 OK"'),
    ('{"error": "connect to postgresql://skiplock:s3cr3t@db:5432/app failed"}',
     '{"error": "connect to postgresql://***@db:5432/app failed"}'),
    ("host=db user=skiplock password=s3cr3t dbname=app", "host=db user=skiplock password=*** dbname=app"),
    ("https://alice:s3cr3t@example.com/", "https://***@example.com/"),
    ("token=admin-bot route=/v1/tasks", "token=admin-bot route=/v1/tasks"),  # a token's name is no secret
])
def test_scrub_removes_secrets_from_log_lines(line, scrubbed):
    assert scrub(line) == scrubbed


def test_a_receivers_body_loses_what_it_quotes_of_the_url_and_the_secret():
    from skiplock.dispatcher.dispatcher import without_secrets
    from skiplock.engine.store import Delivery
    from skiplock.engine.webhooks import generate_secret

    secret = generate_secret()
    delivery = Delivery(**{**dict.fromkeys(Delivery._fields),
                           "url": "https://hooks.example.com/in?access_token=s3cr3t-value&v=1", "secret": secret})
    body = (f"bad token s3cr3t-value for https://hooks.example.com/in?access_token=s3cr3t-value&v=1, "
            f"key {secret.removeprefix('whsec_')}")
    text = without_secrets(body, delivery)
    assert "s3cr3t-value" not in text and secret.removeprefix("whsec_") not in text
    assert "https://hooks.example.com/in?..." in text
