"""anyformer-kohra: text-diffusion language models (MDLM, BD3LM) on onnxruntime.

The plugin module is :mod:`anyformer_kohra.plugin`; :class:`DiffusionStep` is what the ``on_step``
generate option receives.
"""

from anyformer_kohra.steps import DiffusionStep

__all__ = ["DiffusionStep"]
