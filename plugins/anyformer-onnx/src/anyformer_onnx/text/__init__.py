"""Text encoders: the tokenizer and chat template setup, the encoder graph, embeddings and classification."""
