"""The contract's types: model descriptions, caps, requests, verdicts, chunks, messages, errors,
progress events and store entries. Internal: import them from ``anyformer`` or ``anyformer.plugin``.
"""
