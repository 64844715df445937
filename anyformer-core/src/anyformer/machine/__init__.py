"""The machine probe, a service above the contract: what the GPU adapter, its memory, the host memory, the
cores and the store's disk are now (``probe``). Internal: import ``probe`` from ``anyformer``, and
``host_ram_available`` / ``usable_cpu_count`` from ``anyformer.plugin``.
"""
