"""Infer requests checked against a model's declared tensors before they
reach a runner (request_check.py, pure), and the worker processes that run
big checks off the event loop (pool.py starts and feeds them; worker.py is
one). Imports format/, v2/, system/ and errors.
"""
