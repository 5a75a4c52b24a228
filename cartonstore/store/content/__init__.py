"""The blob files: bytes named by their sha256, written through tmp/
and committed by rename (blobs.py), hashed (hashing.py; in order while
parts land out of order: prefix_hash.py), with the kernel's help for big
files (filespace.py). Knows nothing of the index. Imports store/root/ and
the layers below the store.
"""
