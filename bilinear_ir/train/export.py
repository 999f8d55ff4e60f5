"""A trained table similarity in other tools' formats: sentence-transformers, or the head alone.

Every table scorer is two linear maps, `query_table(q) = q A` and `doc_table(d) = d B`
(`scorers.base.table_matrices`), so its score is a dot product of two transformed embeddings.

  * `sentence_transformer(...)` / `save_sentence_transformer`: a folder
    `SentenceTransformer(path)` loads: the encoder's
    HuggingFace weights and tokenizer (Transformer), its pooling and normalisation as trained,
    then a `Router` whose query route is a bias-free, identity-activation `Dense` with weight
    A^T and whose document route is one with B^T; `similarity_fn_name = "dot"` and the prompts as
    trained. `model.encode_query(q) @ model.encode_document(d).T` are the project's scores.
  * `head(...)`: for models over precomputed embeddings (no encoder to ship): `head.safetensors`
    with the two `Dense` weights and a README saying how to apply them.

The sentence-transformers export needs the `st` extra (sentence-transformers, torch); the head
needs nothing beyond numpy and safetensors.
"""
from __future__ import annotations

import os
from typing import Any

import numpy as np
from safetensors.numpy import save_file

from bilinear_ir import files
from bilinear_ir.errors import missing_extra

HEAD_FILE = "head.safetensors"


def sentence_transformer(a: np.ndarray, b: np.ndarray, encoder_folder: str,
                         settings: dict[str, Any]):
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


def save_sentence_transformer(path: str, model, description: dict[str, Any]) -> None:
  """Writes a `sentence_transformer` model folder (atomically) with `bilinear_ir.json`
  (JSON-able facts about the source model)."""
  with files.atomic_dir(path) as tmp:
    model.save(tmp)
    files.atomic_write_json(os.path.join(tmp, "bilinear_ir.json"), description)


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


def head(path: str, a: np.ndarray, b: np.ndarray, description: dict[str, Any]) -> None:
  """Writes `head.safetensors` (the two Dense weights), `README.md` and `bilinear_ir.json`."""

  with files.atomic_dir(path) as tmp:
    save_file({"query.linear.weight": np.ascontiguousarray(a.T, np.float32),
               "document.linear.weight": np.ascontiguousarray(b.T, np.float32)},
              os.path.join(tmp, HEAD_FILE), metadata={"format": "bilinear_ir.head"})
    files.atomic_write_text(os.path.join(tmp, "README.md"), HEAD_README.format(
        embedding=description.get("embedding"), scorer=description.get("scorer"),
        dim=description.get("dim"), source=description.get("model_dir")))
    files.atomic_write_json(os.path.join(tmp, "bilinear_ir.json"), description)
