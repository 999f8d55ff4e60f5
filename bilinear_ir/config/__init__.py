"""What `configs/*.py` import besides `ml_collections` (no jax, no flax: a config loads cheaply).

`blocks` (the config blocks every job shares, each knob with its meaning), `arguments` (a
config's `:k=v,...` argument), `embedding_specs` (the named embeddings of the table jobs).
"""
