"""Data: collections (one loader per format + validation), frozen-encoder embeddings + cache,
BM25 and other sparse vectors, training batches, and the pipeline collection -> embeddings ->
splits."""
