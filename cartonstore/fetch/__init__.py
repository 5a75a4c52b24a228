"""Fetching over HTTP into the store: ``Puller`` (puller.py) adds a carton
by URL, lazily or whole, and completes one whose blobs are missing, from
peers first (peers.py), then LINKS URLs and mirrors (blob_fetcher.py,
transfer.py; a registry's mirrors: registry_mirrors.py, mirror_fetch.py),
or its own remote zip read by ranges (remote_zip.py, remote_mend.py).
Content-Encodings (encoding.py, codings.py), proxies (proxies.py),
redirects and host policy (policy.py; what kind of address a host is:
addresses.py; names judged by what they resolve to: resolver.py), the
HTTP client (http.py), big bodies read on their own thread
(socket_body.py), counters (stats.py).
source_kinds.py: what a Puller is built with, the kinds of source it
reads (its own carton URLs; ``cartonstore.oci``'s ``oci://`` references)
and what answers a registry's 401, handed in by whoever builds it
(``cartonstore.config.pulling``): fetch imports nothing above it.
"""
