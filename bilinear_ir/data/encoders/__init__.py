"""The project's frozen encoders: pure Flax Linen BERT and MPNet read from HuggingFace-layout
folders (safetensors weights, `tokenizers` tokenizer; no transformers, no torch).

    encoder = load_encoder("all-MiniLM-L6-v2", cache_dir)
    ids = encoder.tokenize(texts, max_length=256)                 # [N] lists of ints
    hidden = jax.jit(encoder.hidden)(encoder.params, ids, mask)   # [B, L, n] after padding
    vectors = pool(hidden, mask, "mean", normalize=True)          # [B, n]
"""
from bilinear_ir.data.encoders.load import POOLINGS
from bilinear_ir.data.encoders.load import Encoder
from bilinear_ir.data.encoders.load import load_encoder
from bilinear_ir.data.encoders.load import load_folder
from bilinear_ir.data.encoders.load import minilm_dir
from bilinear_ir.data.encoders.load import pool
from bilinear_ir.data.encoders.load import resolve

__all__ = ["POOLINGS", "Encoder", "load_encoder", "load_folder", "minilm_dir", "pool", "resolve"]
