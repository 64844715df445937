"""Products and FFNs over quantised weights (numpy and numba), expert compute and routing."""
