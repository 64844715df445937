"""The engines that run a model's layers: :mod:`.cpu` (numpy) and :mod:`.gpu` (wgpu)."""
