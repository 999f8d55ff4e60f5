"""A trained table similarity as a sentence-transformers model.

Every table scorer is two linear maps, `query_table(q) = q A` and `doc_table(d) = d B`
(`scorers.base.table_matrices`), so its score is a dot product of two transformed embeddings.
`build(...)` / `save(...)`: a folder `SentenceTransformer(path)` loads: the encoder's
HuggingFace weights and tokenizer (Transformer), its pooling and normalisation as trained, then a
`Router` whose query route is a bias-free, identity-activation `Dense` with weight A^T and whose
document route is one with B^T; `similarity_fn_name = "dot"` and the prompts as trained.
`model.encode_query(q) @ model.encode_document(d).T` are the project's scores.

The query-side form (`query_side_layers`; `build(layers, [], ...)`): score(q, d) = q A B^T d^T =
(q M) . d with M = A B^T [n, n], so the query route is one `Dense` with weight M^T and the
document route is empty: documents are the encoder's raw embeddings, and an index already built
over them serves the learned similarity unchanged (every table scorer, whatever its table width).
The residual adapter (`scorers.adapter`, q + f(q)) has raw documents already; its query route is
two `Dense` layers that compute q + f(q) exactly (`adapter_layers`). Every module of the folder is
one of sentence-transformers' own, so it loads without trust_remote_code (sentence-transformers 6
imports a module class from outside its own package only with trust_remote_code=True), and every
weight is written as safetensors.

Needs the `st` extra (sentence-transformers, torch), imported inside `build` (absolute imports:
the third-party `sentence_transformers`, not this module). Models over precomputed embeddings
have no encoder to ship: `export.head`.
"""
from __future__ import annotations

import dataclasses
import os
from typing import Any

import numpy as np

from bilinear_ir import files
from bilinear_ir.errors import missing_extra
from bilinear_ir.scorers.adapter import QueryAdapter
from bilinear_ir.scorers.base import TableScorer
from bilinear_ir.scorers.base import table_matrices


@dataclasses.dataclass(frozen=True)
class Layer:
  """One sentence-transformers `Dense`: x [B, i] -> activation(x weight + bias) [B, o].

  Attributes:
    weight: [i, o].
    bias: [o], or None (no bias).
    activation: "identity" or "silu".
  """
  weight: np.ndarray
  bias: np.ndarray | None = None
  activation: str = "identity"


def query_side_matrix(a: np.ndarray, b: np.ndarray) -> np.ndarray:
  """M [n, n] = A B^T of a linear table scorer's matrices (`scorers.base.table_matrices`: A, B
  [n, w]), so that score(q, d) = (q M) . d over the raw doc embeddings (WDP: diag(v); bilinear:
  W; residual low-rank: I + P Q^T), computed in float64.
  """
  return (a.astype(np.float64) @ b.astype(np.float64).T).astype(np.float32)


def adapter_layers(params: Any) -> list[Layer]:
  """The residual adapter's query side q + f(q), f(q) = silu(q W1 + b1) W2 + b2
  (`scorers.adapter`: W1 [n, h], W2 [h, n]), as two `Dense` layers of built-in modules:

    x = silu(q [I, -I, W1] + [0, 0, b1])       [B, 2n + h]
    x [I; -I; W2] + b2 = silu(q) - silu(-q) + f(q) = q + f(q)    [B, n]

  since silu(t) - silu(-t) = t (sigmoid(t) + sigmoid(-t)) = t: the residual passes through the
  nonlinearity exactly (to float32 rounding), with no module of the project in the folder.
  """
  w1, b1 = (np.asarray(params["hidden"][k], np.float32) for k in ("kernel", "bias"))
  w2, b2 = (np.asarray(params["out"][k], np.float32) for k in ("kernel", "bias"))
  eye = np.eye(w1.shape[0], dtype=np.float32)
  zeros = np.zeros(w1.shape[0], np.float32)
  return [Layer(np.concatenate([eye, -eye, w1], axis=1), np.concatenate([zeros, zeros, b1]),
                "silu"),
          Layer(np.concatenate([eye, -eye, w2], axis=0), b2)]


def query_side_layers(module: TableScorer, params: Any) -> list[Layer]:
  """The query route of the query-side export of a table scorer, whose documents are the raw
  embeddings: q [B, n] -> [B, n]. The adapter: `adapter_layers`; a linear table scorer: one
  `Dense` of `query_side_matrix` (a scorer that is neither is refused by `table_matrices`)."""
  if isinstance(module, QueryAdapter):
    return adapter_layers(params)
  return [Layer(query_side_matrix(*table_matrices(module, params)))]


def build(query: list[Layer], doc: list[Layer], encoder_folder: str, settings: dict[str, Any]):
  """The `SentenceTransformer` of a table similarity over a frozen encoder (in memory).

  Args:
    query: the query route's layers, [B, n] -> [B, w]: `[Layer(A)]` (query_table(q) = q A), or
      `query_side_layers` ([B, n] -> [B, n]).
    doc: the document route's layers, [B, n] -> [B, w]: `[Layer(B)]`, or [] (the query-side form:
      documents are the encoder's raw embeddings).
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

  def dense(layer: Layer):
    out = modules.Dense(layer.weight.shape[0], layer.weight.shape[1], bias=layer.bias is not None,
                        activation_function={"identity": torch.nn.Identity,
                                             "silu": torch.nn.SiLU}[layer.activation]())
    with torch.no_grad():
      out.linear.weight.copy_(torch.from_numpy(np.ascontiguousarray(layer.weight.T, np.float32)))
      if layer.bias is not None:
        out.linear.bias.copy_(torch.from_numpy(np.array(layer.bias, np.float32)))
    return out

  n = query[0].weight.shape[0]
  stack = [modules.Transformer(encoder_folder, max_seq_length=int(settings["max_length"])),
           modules.Pooling(n, pooling_mode=settings["pooling"])]
  if settings["normalize"]:
    stack.append(modules.Normalize())
  stack.append(modules.Router.for_query_document(
      query_modules=[dense(x) for x in query], document_modules=[dense(x) for x in doc]))
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
