"""MS MARCO passage files as distributed.

`collection.tsv` (pid, passage), `qrels.<split>.tsv` (qid 0 pid rel) and `queries.<split>.tsv`
(qid, query) for each qrels file. Optional: `top1000.<name>.tsv` (qid pid query passage) becomes
`Collection.candidates[name]` ({qid: [pid, ...]} in file order, for re-ranking);
`triples.train.small.tsv` (query, positive, negative texts) is only recorded as
`Collection.triples_path` and streamed by `msmarco_triples` (for `data.tfds_builder`).
"""
from __future__ import annotations

import os
from typing import Iterator

from bilinear_ir.data import readers
from bilinear_ir.data.collection import Collection
from bilinear_ir.errors import input_error

def load_msmarco(path: str) -> Collection:
  """Loads MS MARCO passage files (see the module docstring)."""
  readers.require_folder(path)
  out = readers.CollectionBuilder(readers.folder_name(path), path)
  corpus = os.path.join(path, "collection.tsv")
  for n, (pid, passage) in readers.tsv(corpus, ("pid", "passage")):
    out.add_doc(pid, "", passage, corpus, f"line {n}", "pid", "passage")
  qrels = readers.split_files(path, "qrels.", ".tsv")
  if not qrels:
    raise input_error("required qrels.<split>.tsv files not found", file=path)
  for split in qrels:
    readers.read_query_tsv(out, os.path.join(path, f"queries.{split}.tsv"))
  for split, file in qrels.items():
    readers.read_qrels(out, split, file)
  for name, file in readers.split_files(path, "top1000.", ".tsv").items():
    lists: dict[str, list[str]] = {}
    for n, (qid, pid, _, _) in readers.tsv(file, ("qid", "pid", "query", "passage")):
      if qid not in out.queries:
        raise input_error(f"unknown query id {qid!r}", file=file, record=f"line {n}", field="qid")
      if pid not in out.doc_row:
        raise input_error(f"unknown doc id {pid!r}", file=file, record=f"line {n}", field="pid")
      lists.setdefault(qid, []).append(pid)
    out.candidates[name] = lists
  triples = os.path.join(path, "triples.train.small.tsv")
  return out.collection(triples_path=triples if os.path.isfile(triples) else "")


def _ids_by_text(ids: list[str], texts: list[str]) -> dict[str, list[str]]:
  by_text: dict[str, list[str]] = {}
  for i, t in zip(ids, texts):
    by_text.setdefault(t, []).append(i)
  return by_text


def msmarco_triples(collection: Collection,
                    split: str = "train") -> Iterator[tuple[int, str, str, str]]:
  """Streams `collection.triples_path`, resolving each line's texts to ids.

  The file holds texts only (query, positive passage, negative passage). The query is the query
  of `split` with that text, the positive the passage with that text judged relevant (> 0) to it
  in `qrels[split]`, the negative the first passage (corpus order) with that text, which must not
  be judged relevant. Texts match exactly; anything else is an `InputError` naming the line.

  Yields:
    (line number, qid, positive doc id, negative doc id).
  """
  file = collection.triples_path
  if not file:
    raise input_error("the collection has no triples.train.small.tsv", file=collection.source)
  judged = collection.qrels.get(split)
  if judged is None:
    raise input_error(f"no qrels split {split!r} to check triples against", file=file)
  qids = sorted(judged)
  query_ids = _ids_by_text(qids, [collection.queries[q] for q in qids])
  doc_ids = _ids_by_text(collection.doc_ids, collection.texts)
  for n, (query, positive, negative) in readers.tsv(file, ("query", "positive", "negative")):
    record = f"line {n}"
    for field, text, index in (("query", query, query_ids), ("positive", positive, doc_ids),
                               ("negative", negative, doc_ids)):
      if text not in index:
        raise input_error(f"text not found in the {split} queries / the collection", file=file,
                          record=record, field=field)
    pairs = [(q, d) for q in query_ids[query] for d in doc_ids[positive] if judged[q].get(d, 0) > 0]
    if not pairs:
      raise input_error(f"passage is not judged relevant to the query in qrels {split!r}",
                        file=file, record=record, field="positive")
    qid, pos = pairs[0]
    neg = doc_ids[negative][0]
    if judged[qid].get(neg, 0) > 0:
      raise input_error(f"negative {neg!r} is judged relevant to query {qid!r}", file=file,
                        record=record, field="negative")
    yield n, qid, pos, neg
