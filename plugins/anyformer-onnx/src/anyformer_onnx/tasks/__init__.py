"""The tasks this backend runs: one module per family, listed in :mod:`anyformer_onnx.tasks.registry`."""
