"""The operating system, with nothing of cartons: the bottom layer above
``cartonstore.errors``.

libc.py (the C library through dlopen), parent_death.py (PR_SET_PDEATHSIG
for children), exit_notice.py (a child's exit noticed at once),
malloc_tuning.py and long_lived.py (a serving process's heap), shm_objects.py
(POSIX shared-memory objects), sockets.py (listening sockets: Unix, TCP,
systemd's), hosts.py, flights.py (single flight, all-or-none) and
lazy_names.py (a package's names imported on first use). Import the module
you need; this package loads none of them.
"""
