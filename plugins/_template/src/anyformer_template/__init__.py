"""anyformer-template: a complete, copyable anyformer backend.

It runs a character-level n-gram model (:mod:`anyformer_template.ngram`) stored as
``ngram.json``: a real engine that is tiny enough for the conformance kit to run in any CI. The
hooks live in :mod:`anyformer_template.plugin`, which the ``anyformer`` entry point ``template``
names. Copy the folder and rename it to start a backend of your own (see README.md).
"""

__version__ = "0.1.0"

__all__ = ["__version__"]
