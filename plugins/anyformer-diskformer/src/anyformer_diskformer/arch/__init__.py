"""The MoE families diskformer reads: one spec module per family, listed in :mod:`.registry`."""
