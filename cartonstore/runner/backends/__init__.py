"""The runners that ship with cartonstore, each a module run with
``python -m``: ``cartonstore.runner.backends.onnx`` (onnxruntime),
``cartonstore.runner.backends.python`` (Carton's python runner;
requirements.py checks its requirements.txt) and
``cartonstore.runner.backends.torchscript`` (torch.jit; torch_staging.py
moves its tensors). Imports the runner SDK (cartonstore.runner) and the
layers below.
"""
