"""What an infer request's tensors pass through in the daemon, below the
runners that receive them: arena.py (``TensorArena``, a memfd shared with
runners, where big binary bodies are received in place) and arena_wire.py
(its request and answer forms); shm_regions.py (``ShmRegions``, Triton's
system shared-memory regions, per caller) and infer_shm.py (requests that
name them). Imports v2/, system/, format/ and errors.
"""
