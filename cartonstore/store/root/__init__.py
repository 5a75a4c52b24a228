"""The store root on disk, below everything else of the store: where
things live under ROOT (layout.py), cross-process locks (locks.py) and
who owns what in tmp/ (owner.py). Imports only system/, format/ and errors.
"""
