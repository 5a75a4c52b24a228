"""The test kits: real servers, daemons, runners and registries the tests
start on 127.0.0.1 and Unix sockets, and the helpers that drive them.
Imported as ``kit.<name>`` (tests/ is on sys.path, as pytest puts it for
the conftest.py there)."""
