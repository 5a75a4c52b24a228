"""The pure rule for asking a registry's mirrors (fetch/sources/registry_mirrors.py)."""

from __future__ import annotations

from cartonstore.fetch.sources.registry_mirrors import mirror_url, mirrored_blob_urls, registry_of

D = "sha256:" + "ab" * 32
MIRRORS = {"registry.example.com": ("http://mirror-a:5000", "https://mirror-b/"),
           "[::1]:5000": ("http://spegel:30020",)}


def test_a_registry_blob_is_asked_at_each_of_its_mirrors_in_order() -> None:
    url = f"https://registry.example.com/v2/team/model/blobs/{D}"
    assert mirrored_blob_urls(url, MIRRORS) == [
        ("http://mirror-a:5000", f"http://mirror-a:5000/v2/team/model/blobs/{D}?ns=registry.example.com"),
        ("https://mirror-b/", f"https://mirror-b/v2/team/model/blobs/{D}?ns=registry.example.com")]
    assert registry_of(url) == "registry.example.com"


def test_hosts_are_matched_without_case_and_ipv6_authorities_are_kept() -> None:
    assert mirrored_blob_urls(f"http://Registry.Example.COM/v2/m/blobs/{D}", MIRRORS)[0][1].endswith(
        "?ns=Registry.Example.COM")
    assert mirrored_blob_urls(f"http://[::1]:5000/v2/m/blobs/{D}", MIRRORS) == [
        ("http://spegel:30020", f"http://spegel:30020/v2/m/blobs/{D}?ns=%5B::1%5D:5000")]


def test_other_urls_have_no_mirrors() -> None:
    for url in (f"https://other.example.com/v2/m/blobs/{D}",           # a registry not listed
                f"https://registry.example.com/blobs/{D}",              # not the distribution API
                f"https://registry.example.com/v2/m/manifests/{D}",     # not a blob
                f"https://registry.example.com/v2/m/blobs/{D}?x=1",     # not as source_url records it
                "https://registry.example.com/v2/m/blobs/sha256:abc"):  # not a whole digest
        assert mirrored_blob_urls(url, MIRRORS) == []


def test_a_mirror_url_names_the_registry_it_stands_in_for() -> None:
    assert mirror_url("http://m:1", "a/b", "r.example.com:5000", "manifests/v1") == \
        "http://m:1/v2/a/b/manifests/v1?ns=r.example.com:5000"
