"""The named embeddings the table jobs compare, and `precomputed:DIR`: name -> `encoder` fields.

Imports nothing of the project but `errors` (no jax): `configs/*.py` list these names.
"""
from __future__ import annotations

from typing import Any

from bilinear_ir.errors import input_error

# Named embeddings the table jobs compare: name -> the `encoder` fields it sets. "mean" and
# "cls" pool the config's `encoder.model` (all-MiniLM-L6-v2 by default): "mean" is aligned with
# the dot product (all-MiniLM-L6-v2 was trained on its normalised mean), "cls" is misaligned (the
# CLS state, unnormalised); "mpnet-*" are the bilinear paper's aligned encoder,
# all-mpnet-base-v2, pooled the same two ways. Any `precomputed:DIR` is a spec too
# (`embedding_spec`).
EMBEDDINGS = {
    "mean": {"pooling": "mean", "normalize": True},
    "cls": {"pooling": "cls", "normalize": False},
    "mpnet-mean": {"model": "all-mpnet-base-v2", "pooling": "mean", "normalize": True},
    "mpnet-cls": {"model": "all-mpnet-base-v2", "pooling": "cls", "normalize": False},
}
PRECOMPUTED = "precomputed:"


def embedding_spec(name: str) -> dict[str, Any]:
  """The `encoder` fields of embedding `name`: a key of `EMBEDDINGS`, or `precomputed:DIR`
  (the files of DIR, as they are: kind "precomputed", not normalised again)."""
  if name.startswith(PRECOMPUTED) and len(name) > len(PRECOMPUTED):
    return {"kind": "precomputed", "path": name[len(PRECOMPUTED):], "normalize": False}
  if name not in EMBEDDINGS:
    raise input_error(f"unknown embedding {name!r}; known: {', '.join(EMBEDDINGS)} or "
                      f"{PRECOMPUTED}DIR", file="config", field="embeddings")
  return {"kind": "flax", "path": "", **EMBEDDINGS[name]}


def describe_embedding(name: str, model: str = "") -> str:
  """One line for a table heading, e.g. "all-MiniLM-L6-v2, mean pooling, L2-normalised"
  (`model`: the config's `encoder.model`, used by the specs that do not name one)."""
  spec = embedding_spec(name)
  if spec["kind"] == "precomputed":
    return f"precomputed embeddings from {spec['path']}"
  return (f"{spec.get('model', model) or 'all-MiniLM-L6-v2'}, {spec['pooling']} pooling, "
          f"{'L2-normalised' if spec['normalize'] else 'unnormalised'}")
