"""A trained table similarity as a sentence-transformers model.

Every table scorer is two linear maps, `query_table(q) = q A` and `doc_table(d) = d B`
(`scorers.base.table_matrices`), so its score is a dot product of two transformed embeddings.
`build(...)` / `save(...)`: a folder `SentenceTransformer(path)` loads: the encoder's
HuggingFace weights and tokenizer (Transformer), its pooling and normalisation as trained, then a
`Router` whose query route is a bias-free, identity-activation `Dense` with weight A^T and whose
document route is one with B^T; `similarity_fn_name = "dot"` and the prompts as trained.
`model.encode_query(q) @ model.encode_document(d).T` are the project's scores.

The query-side form (`query_side_matrix`; `build(m, None, ...)`): score(q, d) = q A B^T d^T =
(q M) . d with M = A B^T [n, n], so the query route is one `Dense` with weight M^T and the
document route is empty: documents are the encoder's raw embeddings, and an index already built
over them serves the learned similarity unchanged (every table scorer, whatever its table width).

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


def query_side_matrix(a: np.ndarray, b: np.ndarray) -> np.ndarray:
  """M [n, n] = A B^T of a linear table scorer's matrices (`scorers.base.table_matrices`: A, B
  [n, w]), so that score(q, d) = (q M) . d over the raw doc embeddings (WDP: diag(v); bilinear:
  W; residual low-rank: I + P Q^T), computed in float64.

  The hook for a scorer whose query side is not a matrix (the residual adapter q + f(q), whose
  documents are raw already): it gets its own query modules in `build` (a module the project
  ships, so loading needs no trust_remote_code) in place of this matrix's `Dense`.
  """
  return (a.astype(np.float64) @ b.astype(np.float64).T).astype(np.float32)


def build(a: np.ndarray, b: np.ndarray | None, encoder_folder: str, settings: dict[str, Any]):
  """The `SentenceTransformer` of a table similarity over a frozen encoder (in memory).

  Args:
    a: [n, w] query matrix (query_table(q) = q A).
    b: [n, w] doc matrix, or None: documents are the encoder's raw embeddings (the query-side
      form; then a is [n, n], `query_side_matrix`).
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
  stack.append(modules.Router.for_query_document(
      query_modules=[dense(a)], document_modules=[] if b is None else [dense(b)]))
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
