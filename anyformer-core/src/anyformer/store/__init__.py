"""The model store: the Hub client, verified downloads into the Hub cache and where anyformer keeps its
own files. Internal: import what backends need from ``anyformer.plugin``. Listing, removal and ``pull``
ask the backends too, so they live in the host (``anyformer._cache_listing``, ``_cache_removal``, ``_pull``).
"""
