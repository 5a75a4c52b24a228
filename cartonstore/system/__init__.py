"""The operating system, with nothing of cartons: the bottom layer above
``cartonstore.errors``.

libc.py (the C library through dlopen), syscalls.py (raw syscalls and
prctl, numbered per machine), parent_death.py (PR_SET_PDEATHSIG for
children), exit_notice.py (a child's exit noticed at once), child_stop.py
(SIGTERM, grace, SIGKILL, reaped), waiters.py (futures a protocol's
callbacks settle), backoff.py (doubling delays, equal jitter),
pass_over.py (endpoints not asked for a while after they fail), malloc_tuning.py
and long_lived.py (a serving process's heap), unfilled.py (buffers not
written before their bytes come), shm_objects.py (POSIX shared-memory
objects), sockets.py (listening sockets: Unix, TCP, systemd's),
connection_gate.py (accepting within a cap per listener and per address),
fd_limit.py (the descriptor limit, shared among listeners), callers.py (a
Unix-socket peer's credentials, and files opened with them), file_access.py
(why this process may not use a file, and who may), the runner
sandbox's pieces: confine.py (the launcher), landlock.py, seccomp.py,
keyring.py, cgroups.py; hosts.py, system/single_flight.py (single flight, all-or-none)
and lazy_names.py (a package's names imported on first use). Import the
module you need; this package loads none of them.
"""
