"""GGUF models on the GPU through wgpu: the engine library shared by anyformer's WGSL back ends.

Nothing here is an anyformer backend; the plugins that use it (``anyformer-localmind``, diskformer)
import only its light modules (``model_choice``) at hook-module level and the rest inside their
``load`` hooks, so importing this package stays cheap (wgpu loads on first use).
"""

__version__ = "0.1.0"
