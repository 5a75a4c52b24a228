"""Whole-carton operations, above the pure parsers (``format``, ``zipfmt``)
and the local sources (``sources``), below the store.

checks.py: ``check_carton`` validates a carton view (MANIFEST, LINKS,
carton.toml, tensor data, symlinks) into a ``CheckedCarton``; writer.py:
``write_carton`` writes one as a zip; pack.py: ``pack_directory``;
selftest.py: a carton's self-tests (``self_test_cases``, ``run_self_tests``,
``infer_via``), run against anything that forwards a v2 request. Import the
module you need; this package loads none of them.
"""
