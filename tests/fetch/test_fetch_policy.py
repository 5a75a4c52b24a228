"""URL policy: schemes, host patterns, redirects and safe descriptions."""

from __future__ import annotations

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from cartonstore.errors import FetchError, InvalidInput
from cartonstore.fetch.http.policy import UrlPolicy, describe, redirect_target

OPEN = UrlPolicy()


# --- schemes and shape -------------------------------------------------------

@pytest.mark.parametrize("url", [
    "http://models.example.com/a.carton",
    "https://models.example.com/a.carton",
    "HTTPS://Models.Example.COM/a.carton",
    "https://models.example.com:8443/a?x=1#frag",
    "https://user:token@models.example.com/a.carton",
    "http://127.0.0.1:8080/x",
    "http://[::1]:8080/x",
    "http://[fd12::1%25eth0]/x",
    "https://bücher.example/model",
    "https://models.example.com./a",
    "http://under_score.example/",
])
def test_acceptable_urls_are_returned_unchanged(url: str) -> None:
    assert OPEN.check(url) == url


@pytest.mark.parametrize("url, scheme", [
    ("ftp://models.example.com/a.carton", "ftp"),
    ("file:///etc/passwd", "file"),
    ("file://localhost/etc/passwd", "file"),
    ("data:text/plain,hello", "data"),
    ("javascript:alert(1)", "javascript"),
    ("gopher://example.com/", "gopher"),
    ("ws://example.com/", "ws"),
    ("s3://bucket/key", "s3"),
    ("FTP://example.com/", "ftp"),
    ("localhost:8080/x", "localhost"),
])
def test_other_schemes_are_refused(url: str, scheme: str) -> None:
    with pytest.raises(InvalidInput) as caught:
        OPEN.check(url)
    assert caught.value.message == (
        f"scheme '{scheme}' is not allowed (only http and https): {describe(url)}"
    )
    assert caught.value.subject == url


@pytest.mark.parametrize("url, problem", [
    ("models.example.com/a.carton", "has no scheme"),
    ("/local/path.carton", "has no scheme"),
    ("//models.example.com/a", "has no scheme"),
    ("", "has no scheme"),
    ("http:///a.carton", "has no host"),
    ("http:models.example.com", "has no host"),
    ("https://", "has no host"),
    ("http://exa mple.com/", "whitespace or control"),
    ("http://example.com/a\nb", "whitespace or control"),
    (" http://example.com/", "whitespace or control"),
    ("http://example.com/\x00", "whitespace or control"),
    ("http://example.com:99999/", "malformed URL"),
    ("http://example.com:port/", "malformed URL"),
    ("http://[::1/", "malformed URL"),
    ("http://[not-ipv6]/", "malformed URL"),
    ("http://0x7f.1/", "invalid host"),
    ("http://2130706433/", "invalid host"),
    ("http://127.1/", "invalid host"),
    ("http://010.0.0.1/", "invalid host"),
    ("http://1.2.3.256/", "invalid host"),
    ("http://a..b/", "invalid host"),
    ("http://ex%41mple.com/", "invalid host"),
])
def test_malformed_urls_are_refused(url: str, problem: str) -> None:
    with pytest.raises(InvalidInput, match=problem):
        OPEN.check(url)


# --- host patterns -----------------------------------------------------------

@pytest.mark.parametrize("patterns, url, allowed", [
    # exact names, case-insensitively, trailing dots ignored on both sides
    (("models.example.com",), "https://models.example.com/a", True),
    (("models.example.com",), "https://MODELS.Example.com/a", True),
    (("Models.Example.COM.",), "https://models.example.com./a", True),
    (("models.example.com",), "https://models.example.com:8443/a", True),
    (("models.example.com",), "https://example.com/a", False),
    (("models.example.com",), "https://a.models.example.com/a", False),
    (("models.example.com",), "https://models.example.com.evil.net/a", False),
    (("models.example.com",), "https://evilmodels.example.com/a", False),
    (("models.example.com",), "https://models.example.com@evil.net/a", False),
    # wildcards: any depth of subdomain, never the domain itself
    (("*.example.com",), "https://a.example.com/", True),
    (("*.example.com",), "https://a.b.example.com/", True),
    (("*.example.com",), "https://A.EXAMPLE.COM./", True),
    (("*.example.com",), "https://example.com/", False),
    (("*.example.com",), "https://badexample.com/", False),
    (("*.example.com",), "https://example.com.evil.net/", False),
    (("*.example.com",), "http://10.0.0.1/", False),
    # IP addresses and networks match IP literals only
    (("10.0.0.0/8",), "http://10.1.2.3/", True),
    (("10.0.0.0/8",), "http://11.0.0.1/", False),
    (("10.0.0.0/8",), "http://ten.example/", False),
    (("10.1.2.3",), "http://10.1.2.3:80/", True),
    (("10.1.2.3",), "http://10.1.2.4/", False),
    (("192.168.0.0/16", "::1/128"), "http://[::1]/", True),
    (("::1",), "http://[0:0:0:0:0:0:0:1]/", True),
    (("[::1]",), "http://[::1]/", True),
    (("fd00::/8",), "http://[fd12:3456::1]/", True),
    (("fd00::/8",), "http://[fd80::1]/", True),
    (("fd00::/8",), "http://[fc00::1]/", False),
    (("fe80::/10",), "http://[fe80::1%25eth0]/", True),
    (("10.0.0.0/8",), "http://[::ffff:10.0.0.1]/", True),  # IPv4-mapped
    (("10.0.0.0/8",), "http://[::ffff:a00:1]/", True),
    (("::/0",), "http://10.0.0.1/", False),  # versions never mix
    (("0.0.0.0/0",), "http://[::1]/", False),
    # IDN: compared as punycode, whichever form each side uses
    (("bücher.example",), "https://xn--bcher-kva.example/", True),
    (("xn--bcher-kva.example",), "https://bücher.example/", True),
    (("BÜCHER.example",), "https://Bücher.example/", True),
    (("*.bücher.example",), "https://models.xn--bcher-kva.example/", True),
    (("bücher.example",), "https://bucher.example/", False),
])
def test_allow_hosts(patterns: tuple[str, ...], url: str, allowed: bool) -> None:
    policy = UrlPolicy(allow_hosts=patterns)
    if allowed:
        assert policy.check(url) == url
    else:
        with pytest.raises(InvalidInput, match="is not in allow_hosts"):
            policy.check(url)
    # The same patterns as a deny list refuse exactly what they allowed.
    deny = UrlPolicy(deny_hosts=patterns)
    if allowed:
        with pytest.raises(InvalidInput, match=r"is denied \(deny_hosts\)"):
            deny.check(url)
    else:
        assert deny.check(url) == url


def test_deny_wins_over_allow() -> None:
    policy = UrlPolicy(allow_hosts=("*.example.com",), deny_hosts=("internal.example.com",))
    assert policy.check("https://models.example.com/") == "https://models.example.com/"
    with pytest.raises(InvalidInput, match="denied") as caught:
        policy.check("https://internal.example.com/x?token=abc")
    assert caught.value.message == (
        "host 'internal.example.com' is denied (deny_hosts): https://internal.example.com/x?..."
    )
    with pytest.raises(InvalidInput, match="not in allow_hosts"):
        policy.check("https://example.org/")


def test_typical_ssrf_deny_list() -> None:
    policy = UrlPolicy(deny_hosts=("127.0.0.0/8", "10.0.0.0/8", "169.254.0.0/16", "::1",
                                   "fc00::/7", "localhost"))
    for url in ["http://127.0.0.1/", "http://169.254.169.254/latest/meta-data/",
                "http://[::1]/", "http://LOCALHOST./", "http://[::ffff:127.0.0.1]/",
                "http://[fd00::1]/"]:
        with pytest.raises(InvalidInput):
            policy.check(url)
    # Numeric forms that resolvers read as 127.0.0.1 do not get past it.
    for url in ["http://2130706433/", "http://0x7f000001/", "http://0177.0.0.1/", "http://127.1/"]:
        with pytest.raises(InvalidInput, match="invalid host"):
            policy.check(url)
    assert policy.check("https://models.example.com/") == "https://models.example.com/"


@pytest.mark.parametrize("pattern", [
    "", "*", "*.", "*.*.example.com", "a.*.example.com", "example.com:8080", "http://example.com",
    "10.0.0.0/33", "10.0.0.0/x", "*.10.0.0.0/8", "::1/129", "exa mple.com", "*10.0.0.1", "a..b",
    "0x7f.1",
])
def test_bad_patterns_are_refused_when_the_policy_is_made(pattern: str) -> None:
    with pytest.raises(InvalidInput, match="bad host pattern"):
        UrlPolicy(allow_hosts=(pattern,))
    with pytest.raises(InvalidInput, match="in deny_hosts"):
        UrlPolicy(deny_hosts=("ok.example", pattern))


def test_policy_fields_are_validated_and_normalized() -> None:
    with pytest.raises(InvalidInput, match="not a string"):
        UrlPolicy(allow_hosts="models.example.com")  # type: ignore[arg-type]  # a wrong type on purpose
    with pytest.raises(InvalidInput, match="max_redirects"):
        UrlPolicy(max_redirects=-1)
    policy = UrlPolicy(allow_hosts=["a.example"])  # type: ignore[arg-type]  # a list, normalized to a tuple: what is tested
    assert policy.allow_hosts == ("a.example",)
    assert hash(policy) == hash(UrlPolicy(allow_hosts=("a.example",)))
    assert UrlPolicy().max_redirects == 5


def test_cidr_with_host_bits_is_the_network() -> None:
    policy = UrlPolicy(allow_hosts=("10.1.2.3/8",))
    assert policy.check("http://10.200.0.1/") == "http://10.200.0.1/"


# --- redirects ---------------------------------------------------------------

BASE = "https://models.example.com/dir/sub/file.carton?sig=abc"


@pytest.mark.parametrize("location, target", [
    ("https://cdn.example.net/x", "https://cdn.example.net/x"),
    ("http://cdn.example.net/x", "http://cdn.example.net/x"),
    ("//cdn.example.net/x", "https://cdn.example.net/x"),
    ("/root.carton", "https://models.example.com/root.carton"),
    ("other.carton", "https://models.example.com/dir/sub/other.carton"),
    ("../up.carton", "https://models.example.com/dir/up.carton"),
    ("../../../../top", "https://models.example.com/top"),
    ("?sig=def", "https://models.example.com/dir/sub/file.carton?sig=def"),
    ("./", "https://models.example.com/dir/sub/"),
    ("  /padded  ", "https://models.example.com/padded"),
    ("ftp://files.example.com/x", "ftp://files.example.com/x"),
])
def test_redirect_target(location: str, target: str) -> None:
    assert redirect_target(BASE, location) == target


def test_redirect_targets_still_go_through_the_policy() -> None:
    policy = UrlPolicy(deny_hosts=("169.254.169.254",))
    with pytest.raises(InvalidInput, match="scheme 'ftp'"):
        policy.check(redirect_target(BASE, "ftp://files.example.com/x"))
    with pytest.raises(InvalidInput, match="denied"):
        policy.check(redirect_target(BASE, "http://169.254.169.254/latest"))


@pytest.mark.parametrize("location, problem", [
    ("", "without a Location"),
    ("   ", "without a Location"),
    ("/a\r\nSet-Cookie: x", "control characters"),
    ("/a b", "control characters"),
])
def test_bad_redirect_locations(location: str, problem: str) -> None:
    with pytest.raises(FetchError, match=problem) as caught:
        redirect_target(BASE, location)
    assert caught.value.subject == BASE
    assert "sig=abc" not in caught.value.message


# --- describe ----------------------------------------------------------------

@pytest.mark.parametrize("url, shown", [
    ("https://models.example.com/a.carton", "https://models.example.com/a.carton"),
    ("https://user:secret@models.example.com/a", "https://models.example.com/a"),
    ("https://a@b:c@models.example.com:8443/a", "https://models.example.com:8443/a"),
    ("https://h/a?X-Amz-Signature=secret&b=1", "https://h/a?..."),
    ("https://h/a?", "https://h/a?..."),
    ("https://h/a#frag", "https://h/a"),
    ("https://h/a#frag?x=secret", "https://h/a"),
    ("https://h/p@ath", "https://h/p@ath"),
    ("https://h/a?next=http://u:p@x/", "https://h/a?..."),
    ("http://[::1]:80/a", "http://[::1]:80/a"),
    ("http://[::1/a", "http://[::1/a"),
    ("http://h/a\nFAKE LOG LINE", "http://h/a\\nFAKE LOG LINE"),
    ("http://h/\x1b[31mred", "http://h/\\x1b[31mred"),
    ("https://bücher.example/", "https://bücher.example/"),
    ("not a url at all", "not a url at all"),
    ("", ""),
])
def test_describe(url: str, shown: str) -> None:
    assert describe(url) == shown


@settings(max_examples=300, deadline=None, database=None)
@given(st.text(max_size=80))
def test_describe_never_raises_and_never_shows_secrets(url: str) -> None:
    shown = describe("https://user:SECRET@h/" + url + "?token=SECRET")
    assert "SECRET" not in shown or "SECRET" in url.split("?")[0].split("#")[0]
    assert all(c.isprintable() for c in shown)


@settings(max_examples=300, deadline=None, database=None)
@given(st.text(max_size=60))
def test_check_only_raises_invalid_input(url: str) -> None:
    for candidate in (url, "http://" + url, "https://h/" + url):
        try:
            assert OPEN.check(candidate) == candidate
        except InvalidInput as error:
            assert error.subject == candidate


@pytest.mark.parametrize("url", ["http://169.254.169.254/latest/meta-data/", "http://169.254.0.1:8080/x",
                                 "http://[fe80::1%25eth0]/x", "http://[fd00:ec2::254]/", "http://[::ffff:169.254.1.1]/",
                                 "https://metadata.google.internal/computeMetadata/v1/",
                                 "http://[64:ff9b::a9fe:a9fe]/latest/", "http://100.100.100.200/latest/meta-data/"])
def test_link_local_and_metadata_hosts_are_refused_unless_allowed(url: str) -> None:
    with pytest.raises(InvalidInput, match="link-local or cloud metadata"):
        UrlPolicy().check(url)
    host = url.split("//", 1)[1].split("/", 1)[0].rsplit(":", 1)[0] if "[" not in url else \
        url.split("[", 1)[1].split("]", 1)[0].split("%", 1)[0]
    assert UrlPolicy(allow_hosts=(host,)).check(url) == url


def test_a_name_resolving_to_a_metadata_address_is_refused_by_the_resolver() -> None:
    """The connector's resolver filters getaddrinfo's answers as the policy
    filters URLs: 'localhost' keeps its loopback answers; a host whose
    answers are all link-local (169.254.169.254 read back by getaddrinfo)
    is refused, unless allow_hosts names it."""
    import asyncio

    from cartonstore.fetch.http.resolver import GuardedResolver

    async def resolve(host: str, policy: UrlPolicy) -> list:
        resolver = GuardedResolver(policy)
        try:
            return await resolver.resolve(host, 80)
        finally:
            await resolver.close()

    assert all(a["host"] in ("127.0.0.1", "::1") for a in asyncio.run(resolve("localhost", UrlPolicy())))
    with pytest.raises(OSError, match="resolves only to link-local or cloud metadata addresses"):
        asyncio.run(resolve("169.254.169.254", UrlPolicy()))
    allowed = asyncio.run(resolve("169.254.169.254", UrlPolicy(allow_hosts=("169.254.169.254",))))
    assert [a["host"] for a in allowed] == ["169.254.169.254"]
