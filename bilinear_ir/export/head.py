"""A trained table similarity as its bare head: the two matrices, for any vector database.

Every table scorer is two linear maps, `query_table(q) = q A` and `doc_table(d) = d B`
(`scorers.base.table_matrices`). For models over precomputed embeddings (no encoder to ship),
`save(...)` writes `head.safetensors` with the two weights (as bias-free `Dense` / Linear
weights), a README saying how to apply them and `bilinear_ir.json`. Needs nothing beyond numpy
and safetensors.
"""
from __future__ import annotations

import os
from typing import Any

import numpy as np
from safetensors.numpy import save_file

from bilinear_ir import files

HEAD_FILE = "head.safetensors"


HEAD_README = """# A learned similarity head (bilinear_ir)

Score a query embedding q [n] against a document embedding d [n] (the embeddings this model was
trained on: {embedding}) as

    score(q, d) = (q @ A) . (d @ B)

with A = `query.linear.weight`.T and B = `document.linear.weight`.T from `head.safetensors`
(each stored as a bias-free Linear / sentence-transformers `Dense` weight of shape [w, n]):

    from safetensors.numpy import load_file
    w = load_file("head.safetensors")
    q_table = queries @ w["query.linear.weight"].T      # [Q, w]
    d_table = docs @ w["document.linear.weight"].T      # [N, w]
    scores = q_table @ d_table.T                        # [Q, N]

`d_table` is what a vector database indexes (maximum inner product search); queries are
searched with `q_table`. Model: {scorer} (dim {dim}), from {source}.
"""


def save(path: str, a: np.ndarray, b: np.ndarray, description: dict[str, Any]) -> None:
  """Writes `head.safetensors` (the two Dense weights), `README.md` and `bilinear_ir.json`.

  Args:
    path: the folder (replaced if it exists).
    a: [n, w] query matrix (query_table(q) = q A).
    b: [n, w] doc matrix.
    description: JSON-able facts about the source model (embedding, scorer, dim, model_dir).
  """
  with files.atomic_dir(path) as tmp:
    save_file({"query.linear.weight": np.ascontiguousarray(a.T, np.float32),
               "document.linear.weight": np.ascontiguousarray(b.T, np.float32)},
              os.path.join(tmp, HEAD_FILE), metadata={"format": "bilinear_ir.head"})
    files.atomic_write_text(os.path.join(tmp, "README.md"), HEAD_README.format(
        embedding=description.get("embedding"), scorer=description.get("scorer"),
        dim=description.get("dim"), source=description.get("model_dir")))
    files.atomic_write_json(os.path.join(tmp, "bilinear_ir.json"), description)
