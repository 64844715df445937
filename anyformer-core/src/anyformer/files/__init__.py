"""Bounded readers of model files (GGUF, safetensors, ONNX) and config.json, run before any engine
sees a file. Internal: import them from ``anyformer.plugin``.
"""
