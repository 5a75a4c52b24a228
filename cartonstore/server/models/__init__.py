"""The daemon's model service, independent of HTTP: service.py
(``ModelService``: load, unload, index, metadata, gc) built on leasing.py
(leases and model directories); loaded_model.py (a loaded model's state),
runtime.py (``RunnerHost``: its runner processes), runner_plan.py (which
runner, how many instances, which devices), load_params.py (a load's
parameters), selftest.py (self-tests on load), metrics.py (the Prometheus
registry), server/models/gc_child.py (gc in a child process).
"""
