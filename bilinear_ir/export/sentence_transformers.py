"""A trained table similarity as a sentence-transformers model.

Every table scorer is two linear maps, `query_table(q) = q A` and `doc_table(d) = d B`
(`scorers.base.table_matrices`), so its score is a dot product of two transformed embeddings.
`build(...)` / `save(...)`: a folder `SentenceTransformer(path)` loads: the encoder's
HuggingFace weights and tokenizer (Transformer), its pooling and normalisation as trained, then a
`Router` whose query route is a bias-free, identity-activation `Dense` with weight A^T and whose
document route is one with B^T; `similarity_fn_name = "dot"` and the prompts as trained.
`model.encode_query(q) @ model.encode_document(d).T` are the project's scores.

Needs the `st` extra (sentence-transformers, torch), imported inside `build` (absolute imports:
the third-party `sentence_transformers`, not this module). Models over precomputed embeddings
have no encoder to ship: `export.head`.
"""
from __future__ import annotations

import os
from typing import Any

import numpy as np

from bilinear_ir import files
from bilinear_ir.errors import missing_extra


def build(a: np.ndarray, b: np.ndarray, encoder_folder: str, settings: dict[str, Any]):
  """The `SentenceTransformer` of a table similarity over a frozen encoder (in memory).

  Args:
    a: [n, w] query matrix (query_table(q) = q A).
    b: [n, w] doc matrix.
    encoder_folder: the HuggingFace-layout folder of the frozen encoder.
    settings: the resolved embedding settings: pooling, normalize, max_length, query_prompt,
      doc_prompt.
  """
  try:
    import torch  # pylint: disable=g-import-not-at-top
    from sentence_transformers import SentenceTransformer  # pylint: disable=g-import-not-at-top
    from sentence_transformers.sentence_transformer import modules  # pylint: disable=g-import-not-at-top
  except ImportError:
    raise missing_extra("sentence-transformers and torch", "st",
                        "the sentence-transformers export") from None

  def dense(matrix: np.ndarray):
    layer = modules.Dense(matrix.shape[0], matrix.shape[1], bias=False,
                          activation_function=torch.nn.Identity())
    with torch.no_grad():
      layer.linear.weight.copy_(torch.from_numpy(np.ascontiguousarray(matrix.T)))
    return layer

  n = a.shape[0]
  stack = [modules.Transformer(encoder_folder, max_seq_length=int(settings["max_length"])),
           modules.Pooling(n, pooling_mode=settings["pooling"])]
  if settings["normalize"]:
    stack.append(modules.Normalize())
  stack.append(modules.Router.for_query_document(query_modules=[dense(a)],
                                                 document_modules=[dense(b)]))
  prompts = {name: text for name, text in (("query", settings.get("query_prompt", "")),
                                           ("document", settings.get("doc_prompt", "")))
             if text}
  return SentenceTransformer(modules=stack, device="cpu", similarity_fn_name="dot",
                             prompts=prompts or None)


def save(path: str, model, description: dict[str, Any]) -> None:
  """Writes the folder of a model from `build` (atomically) with `bilinear_ir.json` (JSON-able
  facts about the source model)."""
  with files.atomic_dir(path) as tmp:
    model.save(tmp)
    files.atomic_write_json(os.path.join(tmp, "bilinear_ir.json"), description)
