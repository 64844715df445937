"""The ``anyformer`` command line (CONTRACT §9)."""
