"""The contract between the cartonstore daemon and a runner, whole: every
channel between the two, named here and imported by both sides (the
daemon in ``cartonstore.server``, the SDK in ``cartonstore.runner``).

A runner is any program that serves one model version over KServe v2 REST
(Triton's HTTP protocol) on a Unix socket. ``cartonstore.runner.main``
does everything below for a Python model; a runner in another language, or
on another server, needs this page and nothing else.
``tests/runner/test_protocol.py`` runs such a runner, written against these
names alone, behind a real daemon.

1. The command line (argv)
--------------------------
The daemon runs the command of ``[runners.<runner_name>]`` in its config,
each ``{placeholder}`` of PLACEHOLDERS replaced by one argument's worth of
text (a value never splits into two arguments; ``{{`` and ``}}`` are
literal braces). The built-in runners take STANDARD_ARGV:

    --model-dir DIR --socket PATH --name NAME --version VERSION
    --opts JSON_OBJECT --devices DEVICE

``{model_dir}``: the carton's directory, read-only (``carton.toml`` and
``model/``). ``{socket}``: the Unix socket path to serve on (unsandboxed;
see 3). ``{name}``/``{version}``: the model as the daemon's clients name
it. ``{opts}``: the carton's ``[runner.opts]`` with the load's config
``parameters`` over them, as one JSON object. ``{devices}``: the one device
of this instance, ``cpu`` or ``cuda:N`` (N as the daemon numbers its GPUs;
the process's CUDA_VISIBLE_DEVICES already names that GPU alone).
``{python}``: the daemon's interpreter. A bad command line exits
EXIT_BAD_ARGUMENTS.

2. The environment
------------------
Unsandboxed, a runner gets the daemon's environment; sandboxed, an
allow-list of it (locale, thread counts) with PATH, a private HOME and
TMPDIR. Either way CUDA_VISIBLE_DEVICES names its GPU (or none) and the
``env`` of its ``[runners.<name>]`` table is added. The daemon adds, each
only when it hands over what it names:

- ARENA_FD_ENV: the fd of the model's tensor arena (8).
- SHM_CHANNEL_ENV: the fd of a datagram socket that brings shared-memory
  regions' fds to a sandboxed runner (9).
- MODEL_CHANNEL_ENV and WARM_DEVICES_ENV: the fd of the model channel and
  the device to warm up on, for a runner started before its model (4).
  Only the built-in runners are started so; a ``[runners.<name>]`` command
  never is.

FD_ENVS lists the variables that name an fd; a runner that execs another
program keeps each named fd open across the exec or unsets its variable.

3. Inherited file descriptors
-----------------------------
- The listening socket. A sandboxed runner may not bind its socket (it
  cannot reach the directory it lives in), so the daemon binds it and
  passes it as systemd's socket activation does: fd LISTEN_FD, with
  ``LISTEN_FDS=1`` and ``LISTEN_PID`` set to the runner's pid. A runner
  whose LISTEN_PID is its own pid must serve on that fd (and unset the
  three LISTEN_* variables before starting children); otherwise it binds
  ``--socket`` itself, mode 0600, and removes it when it exits. The SDK
  does both; a third-party runner that only binds by path works
  unsandboxed alone.
- The fds that ARENA_FD_ENV, SHM_CHANNEL_ENV and MODEL_CHANNEL_ENV name.
  Nothing else: stdin is /dev/null; stdout is read and dropped; stderr is
  read line by line into the daemon's log (rate-limited), and its last
  lines are the reason shown when the runner fails.

4. The model channel (built-in runners started early)
------------------------------------------------------
A runner started while its carton is still being fetched, or as a
pre-warmed spare, finds MODEL_CHANNEL_ENV set: one end of a Unix stream
socket. It imports its framework and warms WARM_DEVICES_ENV's device, then
blocks on the channel for one message (runner/model_channel.py reads and
writes it):

    MODEL_CHANNEL_LENGTH (4 bytes, big-endian): n, with the passed fds as
    SCM_RIGHTS (at most MODEL_CHANNEL_MAX_FDS);
    n bytes (at most MODEL_CHANNEL_MAX_MESSAGE) of JSON:
    {"argv": [...] or null, "fds": [name, ...]}

``argv``, when not null, replaces the runner's own arguments (a spare's
command line names no model); ``fds`` names the passed fds in order
(ARENA_FD_NAME: the tensor arena, to be used as if ARENA_FD_ENV named it).
The channel closing with no message: the runner is not wanted, and exits 0.

5. Readiness
------------
The daemon polls GET READY_PATH until it answers 200, for at most
``runners.ready_timeout``; the runner answers it once its model is loaded.
A runner that exits first, or answers something that is not HTTP, fails
the load with its last stderr lines. Once ready, it asks GET
SERVER_METADATA_PATH once: ``"extensions"`` listing ARENA_EXTENSION turns
the arena on (10).

6. What the daemon sends
------------------------
HTTP/1.1 on the runner's socket, over connections it keeps alive (8), one
request at a time per connection, one connection per request in flight:
a runner must answer several connections at once (at least to answer
READY_PATH while a long infer runs). Every request body has a
Content-Length: never chunked, never compressed, never ``Expect``.

- POST ``infer_path(name)``: an infer the daemon has parsed and checked
  against the carton's declared inputs (names, datatypes, shapes, sizes);
  the model name is ``--name``'s. The body is Triton's binary tensor data
  form: ``Content-Type: application/octet-stream``, the JSON header, whose
  length ``Inference-Header-Content-Length`` gives (HEADER_LENGTH, here
  and below: ``cartonstore.v2.framing``'s name for Triton's header), then
  the inputs' bytes in the header's order, each input's ``"parameters"``
  holding ``binary_data_size``. JSON ``"data"`` a client sent was
  converted to bytes: a runner never parses tensor JSON. Only when no
  input carries bytes (every input in shared memory, or the arena's form)
  is the body the JSON header alone, ``Content-Type: application/json``.
  Requested outputs and their ``binary_data`` parameters are the
  client's, passed on.
- POST ``shm_register_path(region)`` / ``shm_unregister_path(region)``:
  Triton's system shared-memory extension, for regions a client named in a
  request (11). A runner without the extension answers 404 and such
  requests fail with 400 naming why.

7. What a runner answers
------------------------
A v2 infer answer: 200 with the JSON response (``application/json``), or
the binary form (``application/octet-stream`` and HEADER_LENGTH); an error
is a status a v2 server gives with ``{"error": message}``. Content-Length,
chunked, or closing the connection frame the body. Every answer is checked
as hostile: at most ``runners.max_response_size`` (64 KiB for everything
but infer), a head of 64 KiB and 100 lines, no Content-Encoding (the
daemon compresses for its clients, a runner never does), only declared
outputs in their datatypes and shapes; anything else is a 502 and the
connection closed. No header of the runner's reaches a client as sent: the
daemon sets Content-Type and HEADER_LENGTH itself.

An infer answer may carry TIMING_HEADER, where the request's time went in
the runner (``timing_header``): ``queue=NS;input=NS;infer=NS;output=NS``
(waiting for the model, decoding inputs, the model, encoding outputs).
The daemon counts it in Triton's statistics (``parse_timing``); a header
it cannot parse, or one claiming more time than the daemon waited, counts
as none.

8. Keep-alive: the runner holds an idle connection longer than the daemon
--------------------------------------------------------------------------
The daemon reuses an idle connection for at most DAEMON_IDLE_LIMIT
seconds; a runner keeps an idle connection open for RUNNER_IDLE_LIMIT,
which must exceed it. The other order loses requests: a runner that closes
an idle connection at the instant the daemon picks it from its pool and
writes a request has read nothing, and the daemon, which cannot know
whether an infer ran, answers 503 rather than send it twice. With the
runner's limit above the daemon's, the daemon always drops a connection
before the runner would. A runner on a server whose default is shorter
(uvicorn's 5 s) sets it above DAEMON_IDLE_LIMIT, or answers every request
with ``Connection: close``.

9. Stopping, and exit statuses
------------------------------
Unloading (or replacing) a model waits up to ``runners.stop_grace`` for its
requests, then sends SIGTERM to the runner's process group (it runs in a
session of its own), then SIGKILL after ``stop_grace`` again. On SIGTERM a
runner answers new requests 503, finishes those in flight and exits 0. It
dies with the daemon: the daemon sets PR_SET_PDEATHSIG (SIGKILL) before
exec, which exec keeps. A request unanswered after
``runners.request_timeout`` gets the runner killed and restarted.

- EXIT_LOAD_FAILED (3): the model cannot load; the last stderr line says
  why. The daemon shows any runner that exits before it is ready as a
  failed load with its last stderr lines; 3 says it refused, not crashed
  (the sandbox's launcher exits 3 too when it cannot confine the runner).
- EXIT_BAD_ARGUMENTS (2): the command line is not one it takes.
- Anything else, or a signal, after it was ready: it died; the daemon
  restarts it with backoff (``runners.max_restarts``).

10. The arena extension (a runner may ignore it)
------------------------------------------------
Each loaded version has a tensor arena: a memfd sealed against shrinking
and growing, ARENA_FD_ENV's fd. A runner that maps it (read and write,
shared) lists ARENA_EXTENSION in GET SERVER_METADATA_PATH's
``"extensions"``; the daemon then sends big binary infers (256 KiB and
more) in the JSON form, each binary input's bytes named in the arena by
Triton's shared-memory parameters (``shared_memory_region`` ARENA_REGION,
``shared_memory_offset``, ``shared_memory_byte_size``), and the request
parameter ARENA_OUTPUTS, ``{"offset": int, "byte_size": int}``, giving the
span where binary outputs may go. The runner writes binary outputs that
fit into that span, each answered with those three parameters naming where
it put them (and no ``binary_data_size``); outputs that do not fit, JSON
and BYTES outputs (never in the arena) come in its body as usual.
ARENA_REGION is never a registered region: a register of that name is
refused, and status does not list it. A runner that does not list the
extension gets every request over its socket.

11. The shared-memory extension's daemon fields
-----------------------------------------------
A register request's JSON is Triton's (``key``, ``offset``,
``byte_size``) plus fields a plain v2 server ignores: SHM_OBJECT,
``[st_dev, st_ino]`` of the object the daemon checked (a runner that
opens ``key`` and finds another object refuses); SHM_COPY_INPUTS, true for
an object another uid may truncate (read inputs into copies and write
outputs with pwrite: a mapping of it could SIGBUS); SHM_FD_PASSED, true
for a sandboxed runner, which sees no /dev/shm: the daemon has sent the
object's fd first over SHM_CHANNEL_ENV's socket, one datagram per region,
the region's name as its bytes and the fd as SCM_RIGHTS.

12. Decoupled models: many responses to one request
---------------------------------------------------
A runner whose model answers a request with many responses (Triton's
decoupled transaction policy; the SDK's ``infer_stream``) lists
DECOUPLED_EXTENSION in GET SERVER_METADATA_PATH's ``"extensions"``; the
daemon then marks the model decoupled and sends its stream requests,
formed as in 6, to POST ``infer_stream_path(name)``. A 200 answer has
``Connection: close`` and neither Content-Length nor chunked encoding: its
body is a sequence of frames, one v2 response each, up to the end of the
connection. A frame is STREAM_FRAME (8 bytes, big-endian: the JSON
header's length h, the binary data's length b), then h bytes of the
response's JSON header, then b bytes of its binary outputs in the
header's order (each output's ``binary_data_size``). The last frame's
header has the parameter FINAL_PARAMETER true and no outputs; it may
instead be ``{"error": message}`` (the model failed mid-stream), final
too. The daemon checks each frame as it checks an answer (7): each at
most ``runners.max_response_size``, at most MAX_STREAM_RESPONSES of them,
declared outputs only; a bad frame, or the connection ending before the
final one, is a 502 naming what was wrong and the connection is closed.
The daemon reads the frames only as fast as its client takes the
responses: a runner blocks on its socket, and its model on its yield.
An error before the first frame is an ordinary error answer (7).
"""

from __future__ import annotations

import re
import struct

from cartonstore.system.sockets import SD_LISTEN_FDS_START
from cartonstore.v2.statistics import RequestTiming

__all__ = [
    "ARENA_EXTENSION", "ARENA_FD_ENV", "ARENA_FD_NAME", "ARENA_OUTPUTS", "ARENA_REGION", "DAEMON_IDLE_LIMIT",
    "DECOUPLED_EXTENSION", "EXIT_BAD_ARGUMENTS", "EXIT_LOAD_FAILED", "FD_ENVS", "FINAL_PARAMETER", "LISTEN_FD",
    "MAX_STREAM_RESPONSES", "MODEL_CHANNEL_ENV", "MODEL_CHANNEL_LENGTH", "MODEL_CHANNEL_MAX_FDS",
    "MODEL_CHANNEL_MAX_MESSAGE", "PLACEHOLDERS", "READY_PATH", "RUNNER_IDLE_LIMIT", "SERVER_METADATA_PATH",
    "SHM_CHANNEL_ENV", "SHM_COPY_INPUTS", "SHM_FD_PASSED", "SHM_OBJECT", "STANDARD_ARGV", "STREAM_FRAME",
    "TIMING_HEADER", "WARM_DEVICES_ENV", "infer_path", "infer_stream_path", "parse_timing", "shm_register_path",
    "shm_unregister_path", "timing_header",
]

# 1. argv
PLACEHOLDERS = ("model_dir", "socket", "name", "version", "opts", "devices", "python")
STANDARD_ARGV = ("--model-dir", "{model_dir}", "--socket", "{socket}", "--name", "{name}",
                 "--version", "{version}", "--opts", "{opts}", "--devices", "{devices}")

# 2. environment
ARENA_FD_ENV = "CARTONSTORE_ARENA_FD"
SHM_CHANNEL_ENV = "CARTONSTORE_SHM_CHANNEL_FD"
MODEL_CHANNEL_ENV = "CARTONSTORE_MODEL_CHANNEL_FD"
WARM_DEVICES_ENV = "CARTONSTORE_WARM_DEVICES"
FD_ENVS = (ARENA_FD_ENV, SHM_CHANNEL_ENV, MODEL_CHANNEL_ENV)

# 3. inherited fds: systemd's first passed fd
LISTEN_FD = SD_LISTEN_FDS_START

# 4. the model channel
MODEL_CHANNEL_LENGTH = struct.Struct(">I")
MODEL_CHANNEL_MAX_MESSAGE = 1 << 20
MODEL_CHANNEL_MAX_FDS = 4
ARENA_FD_NAME = "arena"

# 5., 6. routes the daemon calls
READY_PATH = "/v2/health/ready"
SERVER_METADATA_PATH = "/v2"


def infer_path(name: str) -> str:
    return f"/v2/models/{name}/infer"


def infer_stream_path(name: str) -> str:
    return f"/v2/models/{name}/infer_stream"


def shm_register_path(region: str) -> str:
    return f"/v2/systemsharedmemory/region/{region}/register"


def shm_unregister_path(region: str) -> str:
    return f"/v2/systemsharedmemory/region/{region}/unregister"


# 7. the timing header
TIMING_HEADER = "Cartonstore-Timing"
_TIMING = re.compile(r"queue=(\d{1,19});input=(\d{1,19});infer=(\d{1,19});output=(\d{1,19})")


def timing_header(timing: RequestTiming) -> str:
    return f"queue={timing.queue_ns};input={timing.input_ns};infer={timing.infer_ns};output={timing.output_ns}"


def parse_timing(text: str | None) -> RequestTiming | None:
    """The timing a runner sent, or None (none sent, or not well formed: a
    runner's header is its own word)."""
    match = _TIMING.fullmatch(text.strip()) if text else None
    return RequestTiming(*(int(g) for g in match.groups())) if match else None


# 8. keep-alive, in seconds: the daemon must let go of an idle connection first
DAEMON_IDLE_LIMIT = 30.0
RUNNER_IDLE_LIMIT = 75.0

# 9. exit statuses
EXIT_BAD_ARGUMENTS = 2   # argparse's
EXIT_LOAD_FAILED = 3

# 10. the arena extension
ARENA_REGION = "cartonstore.arena"
ARENA_OUTPUTS = "cartonstore_arena_outputs"
ARENA_EXTENSION = "cartonstore_arena"

# 11. the daemon's fields in a shared-memory register request
SHM_OBJECT = "cartonstore_object"
SHM_COPY_INPUTS = "cartonstore_copy_inputs"
SHM_FD_PASSED = "cartonstore_fd"

# 12. decoupled models
DECOUPLED_EXTENSION = "cartonstore_decoupled"
STREAM_FRAME = struct.Struct(">II")
FINAL_PARAMETER = "triton_final_response"
MAX_STREAM_RESPONSES = 1 << 20
