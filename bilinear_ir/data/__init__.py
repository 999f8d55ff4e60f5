"""Data: collections (loaders + validation), frozen-encoder embeddings + cache, training batches."""
