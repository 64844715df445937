"""anyformer's transformers backend: safetensors repos on torch, after every engine written for a format.

The plugin module (``anyformer_transformers.plugin``) imports neither torch nor transformers: every
``anyformer check`` imports it, and ``can_run`` decides from the description, config.json and a
look at the installed transformers' tables (read as text, never imported).
"""

#: This backend's id: the name of its entry point.
BACKEND_ID = "transformers"

__all__ = ["BACKEND_ID"]
