"""The chat decoder: the graph and its KV cache, the token loop, sampling, and the chat handle."""
