"""Graph rewrites for the CPU: attention, MLP and norm fusion, and the store of fused graphs."""
