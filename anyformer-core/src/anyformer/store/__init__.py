"""The model store: the Hub client, verified downloads into the Hub cache, listing, removal and
``pull``. Internal: import what backends need from ``anyformer.plugin``.
"""
