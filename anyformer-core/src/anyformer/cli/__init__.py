"""The ``anyformer`` command line (docs/user-guide.md)."""
