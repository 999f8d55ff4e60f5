"""Sparse rankers: BM25 equal to bm25s; gensim BM25, TF-IDF, boolean equal to direct formulas."""
from __future__ import annotations

import collections
import math
import os
import shutil

import bm25s
import numpy as np
import pytest
import Stemmer

from bilinear_ir.data import bm25
from bilinear_ir.errors import InputError

WORDS = ("The Cells cell running runs ran protein proteins of and in a x DNA gene genes "
         "expression Expressed mouse mice! tumour tumor, growth (growth) factor receptor "
         "binding bind bound insulin is are was not with 3 42 p53 IL-6 T-cells").split()


def _corpus(seed: int, n_docs: int = 60, n_queries: int = 15):
  rng = np.random.default_rng(seed)
  docs = [" ".join(rng.choice(WORDS, size=int(rng.integers(3, 40)))) for _ in range(n_docs)]
  queries = [" ".join(rng.choice(WORDS, size=int(rng.integers(2, 8)))) for _ in range(n_queries)]
  queries.append("zebra unicorn")  # no known token: every score 0
  return docs, queries


def _bm25s_scores(docs, queries, method, k1, b, stemmer=None):
  doc_tokens = bm25s.tokenize(docs, return_ids=False, stemmer=stemmer, show_progress=False)
  query_tokens = bm25s.tokenize(queries, return_ids=False, stemmer=stemmer, show_progress=False)
  retriever = bm25s.BM25(k1=k1, b=b, method=method)
  retriever.index(doc_tokens, show_progress=False)
  return np.stack([retriever.get_scores(t) if t else np.zeros(len(docs)) for t in query_tokens])


@pytest.mark.parametrize("method,k1,b,stem", [
    ("lucene", 1.5, 0.75, ""), ("lucene", 1.5, 0.75, "english"), ("lucene", 0.9, 0.4, ""),
    ("robertson", 1.2, 0.75, ""), ("atire", 1.5, 0.3, "english")])
def test_bm25_equals_bm25s(method, k1, b, stem):
  docs, queries = _corpus(0)
  stemmer = Stemmer.Stemmer(stem) if stem else None
  expected = _bm25s_scores(docs, queries, method, k1, b, stemmer)
  model = bm25.BM25(k1=k1, b=b, variant=method, tokenizer=bm25.Tokenizer(stemmer=stem))
  got = model.fit(docs).score(queries)
  assert got.shape == (len(queries), len(docs))
  assert np.count_nonzero(expected) > 100
  np.testing.assert_allclose(got, expected, rtol=1e-5, atol=1e-6)
  assert np.all(got[-1] == 0)


def test_bm25s_tokenizer_mirrored():
  texts = ["The T-cells' IL-6 and p53 ran, RUNNING runs: a x 42 É café Über", "", "a an the"]
  for stem in ("", "english"):
    expected = bm25s.tokenize(texts, return_ids=False, show_progress=False,
                              stemmer=Stemmer.Stemmer(stem) if stem else None)
    assert bm25.Tokenizer(stemmer=stem)(texts) == [list(t) for t in expected]


def test_regex_and_wordpiece_tokenizers():
  assert bm25.Tokenizer(kind="regex")(["A b-C, d"]) == [["a", "b", "c", "d"]]
  assert bm25.Tokenizer(kind="regex", pattern=r"\S+")(["A b-C, d"]) == [["a", "b-c,", "d"]]
  wp = bm25.Tokenizer(kind="wordpiece")
  upper, lower = wp(["Tumour GROWTH factors", "tumour growth factors"])
  assert upper == lower  # case-insensitive wordpieces
  assert "##" in "".join(upper) and "[CLS]" not in upper


def test_wordpiece_equals_bert_tokenizer_fast(tmp_path):
  import transformers  # pylint: disable=g-import-not-at-top
  from bilinear_ir.encoders.names import minilm_dir  # pylint: disable=g-import-not-at-top
  texts = ["Über-long T-cell IL-6 receptors (p53) naïve café, 42 mice. " * 30, "", "ab"]
  ref = transformers.BertTokenizerFast.from_pretrained(minilm_dir())
  want = [ref.tokenize(t) for t in texts]
  assert len(want[0]) > 300  # longer than the model's 256/512: no truncation either way
  assert bm25.Tokenizer(kind="wordpiece")(texts) == want
  vocab_only = tmp_path / "bert"  # a folder with only vocab.txt
  vocab_only.mkdir()
  shutil.copy(os.path.join(minilm_dir(), "vocab.txt"), vocab_only / "vocab.txt")
  assert bm25.Tokenizer(kind="wordpiece", model_dir=str(vocab_only))(texts) == want


def _gensim_direct(docs_tokens, query_tokens, k1=1.5, b=0.75, epsilon=0.25):
  """gensim 3.x `BM25.get_score` written out as loops."""
  n = len(docs_tokens)
  avgdl = sum(len(d) for d in docs_tokens) / n
  freqs = [collections.Counter(d) for d in docs_tokens]
  nd = collections.Counter(t for f in freqs for t in f)
  idf = {t: math.log(n - c + 0.5) - math.log(c + 0.5) for t, c in nd.items()}
  floor = epsilon * sum(idf.values()) / len(idf)
  idf = {t: (floor if v < 0 else v) for t, v in idf.items()}
  out = np.zeros((len(query_tokens), n))
  for qi, q in enumerate(query_tokens):
    for di, f in enumerate(freqs):
      denom = k1 * (1 - b + b * len(docs_tokens[di]) / avgdl)
      out[qi, di] = sum(idf[w] * f[w] * (k1 + 1) / (f[w] + denom) for w in q if w in f)
  return out


def test_gensim_variant_equals_direct_formula():
  docs, queries = _corpus(1)
  docs = docs + ["cell cell cell"] * 40  # "cell" in > half the docs: negative raw idf, floored
  tok = bm25.Tokenizer(kind="regex")
  model = bm25.BM25(variant="gensim", tokenizer=tok).fit(docs)
  assert np.any(np.log(model.num_docs - model.df + 0.5) < np.log(model.df + 0.5))
  expected = _gensim_direct(tok(docs), tok(queries))
  np.testing.assert_allclose(model.score(queries), expected, rtol=1e-12, atol=1e-12)


def _dense_counts(tokens, vocab):
  m = np.zeros((len(tokens), len(vocab)))
  for r, row in enumerate(tokens):
    for t in row:
      if t in vocab:
        m[r, vocab[t]] += 1
  return m


def test_tfidf_and_boolean_equal_numpy_formulas():
  docs, queries = _corpus(2)
  tok = bm25.Tokenizer()
  vocab = {t: i for i, t in enumerate(sorted({t for d in tok(docs) for t in d}))}
  d = _dense_counts(tok(docs), vocab)
  q = _dense_counts(tok(queries), vocab)
  idf = np.log(len(docs) / (d > 0).sum(0))
  tfidf = bm25.TFIDF(tok).fit(docs).score(queries)
  np.testing.assert_allclose(tfidf, (q * idf) @ d.T, rtol=1e-12)
  boolean = bm25.Boolean(tok).fit(docs).score(queries)
  np.testing.assert_array_equal(boolean, (q > 0).astype(float) @ (d > 0).T.astype(float))
  assert boolean.max() >= 2


def test_topk_ties_lower_index_first():
  docs = ["alpha beta", "gamma", "alpha beta", "alpha", "alpha beta", "delta"]
  model = bm25.BM25().fit(docs)
  idx, scores = model.topk(["alpha beta", "gamma"], k=4)
  assert idx[0].tolist() == [0, 2, 4, 3]
  assert scores[0, 0] == scores[0, 1] == scores[0, 2] > scores[0, 3] > 0
  assert idx[1].tolist() == [1, 0, 2, 3]  # one hit, then zero-score ties by index
  full = model.score(["alpha beta", "gamma"])
  np.testing.assert_array_equal(scores, np.take_along_axis(full, idx, 1))
  idx_all, _ = bm25.top_k(full, 10)  # k > N: every doc, stable order
  np.testing.assert_array_equal(idx_all, np.argsort(-full, axis=1, kind="stable"))


def test_topk_matches_full_sort_on_random_scores():
  rng = np.random.default_rng(3)
  scores = rng.integers(0, 5, size=(7, 50)).astype(float)  # many ties
  idx, vals = bm25.top_k(scores, 9)
  np.testing.assert_array_equal(idx, np.argsort(-scores, axis=1, kind="stable")[:, :9])
  np.testing.assert_array_equal(vals, np.take_along_axis(scores, idx, 1))


def test_bad_settings_raise_input_error():
  with pytest.raises(InputError, match="bm25.variant"):
    bm25.BM25(variant="okapi")
  with pytest.raises(InputError, match="tokenizer.kind"):
    bm25.Tokenizer(kind="spaces")
  with pytest.raises(InputError, match="empty"):
    bm25.BM25().fit(["a the", "of"])
  with pytest.raises(InputError, match="weighting"):
    bm25.build("bm26")
