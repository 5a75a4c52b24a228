"""Fetching over HTTP into the store, by job: http/ (the HTTP client and
its rules), transfer/ (one blob downloaded and verified), sources/ (remote
cartons read by ranges, local files, peers, mirrors). The top orchestrates
them: ``Puller`` (puller.py) adds a carton by URL, lazily or whole, and
completes one whose blobs are missing; blob_fetcher.py (one download per
blob, peers first); metadata_refetch.py (a remote carton's small files
checked and fetched again); holds.py (a carton held while it completes).
fetch imports nothing above it.
"""
