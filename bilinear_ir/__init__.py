"""bilinear_ir: learned similarity functions for dense retrieval in JAX/Flax.

Embeddings are held fixed; the project learns how to compare them (weighted dot, full and low-rank
bilinear, Mixture-of-Logits, multi-vector, late interaction) and retrieves with what it learned.
"""

__version__ = "0.1.0"
