"""The SQLite index (index.py, schema.py): cartons, entries, names
(names.py), leases (lease_rows.py), what daemons loaded (loaded_rows.py),
where blobs were read from on this host (source_rows.py, local_sources.py),
sizes learnt late (sizes.py), batches and the writer that never waits
(sqlite_ops.py), and the index opened read-only (read_only.py). Knows
nothing of the blob files. Imports store/root/ and the layers below the
store.
"""
