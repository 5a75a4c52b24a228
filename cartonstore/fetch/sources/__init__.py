"""Where a blob or a carton can come from: a .carton read over HTTP by
ranges (remote_zip.py), the local files it was added from (local_files.py),
peers' stores (peers.py), mirrors (mirrors.py) and a registry's mirrors
(registry_mirrors.py). Imports fetch/http/, fetch/transfer/ and store/.
"""
