"""The `embed` job: a collection's embeddings written out, to share or to bring back in.

Writes `WORKDIR/embeddings/` in the layout `encoder.kind = "precomputed"` reads
(bilinear_ir/data/precomputed.py): corpus.npy [N, n] and queries.npy [Q, n] (float32),
corpus_ids.txt and queries_ids.txt (one id per line, in row order), and manifest.json (encoder,
pooling, normalisation, max_length, prompts, collection, hashes). Training on them
(`--config.encoder.kind=precomputed --config.encoder.path=WORKDIR/embeddings`) gives the numbers
training on the encoder gives.
"""
from __future__ import annotations

import functools

import ml_collections

from bilinear_ir import files
from bilinear_ir.data import embeddings
from bilinear_ir.data import loaders
from bilinear_ir.data import pipeline
from bilinear_ir.data import precomputed
from bilinear_ir.report import outputs
from bilinear_ir.experiment import validation


def validate(config: ml_collections.ConfigDict) -> None:
  """Refuses a bad config before any work (`experiment.validation`)."""
  validation.check_data(config.data)
  embeddings.check_encoder(config.encoder)


def manifest(config: ml_collections.ConfigDict, collection, emb) -> dict:
  """What made the embeddings: the encoder block, the collection and content hashes."""
  return {
      "encoder": config.encoder.to_dict(),
      **emb.manifest.get("settings", {}),
      "collection": {"name": collection.name, "format": config.data.format,
                     "docs": collection.num_docs, "queries": len(collection.queries),
                     "doc_ids_sha256": files.sha256_texts(list(emb.doc_ids)),
                     "query_ids_sha256": files.sha256_texts(list(emb.query_ids)),
                     "doc_texts_sha256": files.sha256_texts(collection.doc_strings()),
                     "query_texts_sha256": files.sha256_texts(
                         [collection.queries[q] for q in emb.query_ids])},
      "arrays": {"corpus": files.tree_sha256({"docs": emb.docs}),
                 "queries": files.tree_sha256({"queries": emb.queries})},
      "dim": int(emb.docs.shape[1]),
      "source": emb.manifest,
  }


# pylint: disable-next=unused-argument
def run(config: ml_collections.ConfigDict, workdir: str) -> outputs.Report:
  """The `embed` job (configs/embed.py)."""
  collection = loaders.load(config.data)
  emb = pipeline.embed(collection, config.encoder)
  info = manifest(config, collection, emb)
  results = {"collection": collection.name, "docs": len(emb.doc_ids),
             "queries": len(emb.query_ids), "dim": info["dim"], "manifest": info,
             "files": sorted(name for names in precomputed.PARTS.values() for name in names)
             + [precomputed.MANIFEST]}
  md = (f"# embed: {collection.name}\n\n{len(emb.doc_ids)} docs and {len(emb.query_ids)} "
        f"queries, {info['dim']}-d ({config.encoder.model or 'all-MiniLM-L6-v2'}, "
        f"{info.get('pooling')} pooling, "
        f"{'L2-normalised' if info.get('normalize') else 'unnormalised'}, max_length "
        f"{info.get('max_length')}), written to `embeddings/`.\n")
  return outputs.Report(results=results, markdown=md, folders={
      "embeddings": functools.partial(precomputed.write, embeddings=emb, manifest=info)})
