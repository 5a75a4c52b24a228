"""The daemon's model service, independent of HTTP: service.py
(``ModelService``: leases and model directories, load, unload, index,
metadata, gc); loaded_model.py (a loaded model's state),
runtime.py (``RunnerHost``: its runner processes), runner_plan.py (which
runner, how many instances, which devices), load_params.py (a load's
parameters), loaded_self_tests.py (self-tests on load), metrics.py (the Prometheus
registry), gc_child.py (gc in a child process).
"""
