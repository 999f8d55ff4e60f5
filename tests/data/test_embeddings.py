"""Frozen-encoder embeddings: pooling, bucketing, devices, token outputs and the on-disk cache.

Most tests use a tiny random BERT (2 layers, hidden 32, a 100-word vocabulary written here) saved
to a temporary folder, checked against a direct run of the encoder on one padded batch; one test
loads the real all-MiniLM-L6-v2 from its package.
"""
from __future__ import annotations

import json
import os

import jax
import numpy as np
import pytest

from bilinear_ir import files
from bilinear_ir.data import embeddings
from bilinear_ir.data.collection import Collection
from bilinear_ir.config.blocks import encoder_config
from bilinear_ir.encoders import hf_folder
from bilinear_ir.encoders import names
from bilinear_ir.errors import InputError
from conftest import write_model

WORDS = (
    "the a of and in to is was for with on by that this from as are be at or an were not which "
    "cell cells gene genes protein proteins cancer tumor patients risk disease blood brain heart "
    "mouse mice human study trial dose drug treatment therapy infection virus bacteria immune "
    "response increased decreased reduced higher lower expression levels activity signaling "
    "pathway receptor mutation mutations dna rna binding growth death survival mortality "
    "clinical randomized effect effects associated significantly analysis data results model "
    "age women men children pregnancy diabetes obesity insulin glucose vitamin sleep exercise "
    "stress memory learning liver kidney lung bone muscle"
).split()
MAX_POS = 64


@pytest.fixture(scope="module")
def tiny(tmp_path_factory):
  """A random 2-layer BERT (hidden 32, ~100-word vocabulary) saved as safetensors + tokenizer.

  Returns (folder, reference) where `reference(texts, max_length)` runs the encoder directly on
  one batch padded to `max_length` (no buckets, sorting, devices or cache: the twin of what
  `embeddings` does; the encoder itself is checked against PyTorch in encoders/test_encoders.py):
  (last_hidden_state [N, max_length, n], mask [N, max_length]).
  """
  folder = write_model(str(tmp_path_factory.mktemp("tiny_bert")), "bert", words=WORDS,
                       max_positions=MAX_POS)
  encoder = hf_folder.load_folder(folder)
  hidden_fn = jax.jit(encoder.hidden)

  def reference(texts: list[str], max_length: int):
    ids = encoder.tokenize(texts, max_length)
    batch = np.full((len(ids), max_length), encoder.pad_id, np.int32)
    mask = np.zeros((len(ids), max_length), np.int32)
    for i, row in enumerate(ids):
      batch[i, :len(row)], mask[i, :len(row)] = row, 1
    return np.asarray(hidden_fn(encoder.params, batch, mask)), mask.astype(bool)

  return folder, reference


@pytest.fixture(scope="module")
def tiny_model_dir(tiny) -> str:
  return tiny[0]


@pytest.fixture(scope="module")
def reference13(tiny):
  """TEXTS13 through the encoder directly at max_length 48."""
  return tiny[1](TEXTS13, 48)


def make_texts(n: int, seed: int, lo: int = 1, hi: int = 40) -> list[str]:
  """`n` texts of random vocabulary words with lo..hi words each."""
  rng = np.random.default_rng(seed)
  return [" ".join(rng.choice(WORDS, size=int(rng.integers(lo, hi + 1))))
          for _ in range(n)]


TEXTS13 = make_texts(13, seed=1, hi=60)  # lengths from 3 to 48 (truncated) tokens


def cfg(model_dir: str, cache_dir: str, **overrides):
  c = encoder_config()
  c.model = model_dir
  c.cache_dir = cache_dir
  c.max_length = 48
  c.batch_size = 8
  c.normalize = False
  for k, v in overrides.items():
    c[k] = v
  return c


@pytest.fixture
def count_runs(monkeypatch):
  """Counts calls of the model runner (each one means the cache was not used)."""
  calls = []
  real = embeddings.run_model

  def counted(*args, **kwargs):
    calls.append(1)
    return real(*args, **kwargs)

  monkeypatch.setattr(embeddings, "run_model", counted)
  return calls


def test_mean_pooling_is_masked_mean_of_last_hidden_state(tiny_model_dir, reference13, tmp_path):
  got = embeddings.encode(TEXTS13, cfg(tiny_model_dir, str(tmp_path), pooling="mean"))
  hidden, mask = reference13
  assert mask.sum(1).max() == 48 and mask.sum(1).min() < 32  # truncated and short texts
  want = (hidden * mask[..., None]).sum(1) / mask.sum(1, keepdims=True)
  assert got.shape == (13, 32) and got.dtype == np.float32
  np.testing.assert_allclose(got, want, atol=2e-5, rtol=1e-5)


def test_cls_pooling_is_first_token(tiny_model_dir, reference13, tmp_path):
  got = embeddings.encode(TEXTS13, cfg(tiny_model_dir, str(tmp_path), pooling="cls"))
  hidden, _ = reference13
  np.testing.assert_allclose(got, hidden[:, 0], atol=2e-5, rtol=1e-5)


def test_normalize_gives_unit_rows_in_the_same_direction(tiny_model_dir, tmp_path):
  texts = make_texts(9, seed=3)
  raw = embeddings.encode(texts, cfg(tiny_model_dir, str(tmp_path), normalize=False))
  unit = embeddings.encode(texts, cfg(tiny_model_dir, str(tmp_path), normalize=True))
  np.testing.assert_allclose(np.linalg.norm(unit, axis=1), 1.0, atol=1e-6)
  np.testing.assert_allclose(unit, raw / np.linalg.norm(raw, axis=1, keepdims=True), atol=1e-6)


def test_a_text_gets_the_same_vector_alone_and_among_long_texts(tiny_model_dir, tmp_path):
  short = "cancer cells"
  longs = make_texts(11, seed=4, lo=40, hi=60)  # bucket 48; `short` alone uses bucket 32
  c = cfg(tiny_model_dir, str(tmp_path), batch_size=4)  # 12 texts: short one in the last batch
  alone = embeddings.encode([short], c)[0]
  mixed = embeddings.encode(longs[:6] + [short] + longs[6:], c)
  np.testing.assert_allclose(mixed[6], alone, atol=1e-5)
  # Order is the input order: each long text equals its own encoding.
  np.testing.assert_allclose(mixed[7], embeddings.encode([longs[6]], c)[0], atol=1e-5)


def test_one_compilation_per_bucket_not_per_batch(tiny_model_dir, tmp_path):
  texts = make_texts(40, seed=5, lo=1, hi=60)
  embeddings._forward.cache_clear()  # pylint: disable=protected-access
  c = cfg(tiny_model_dir, str(tmp_path), batch_size=4)  # 10 batches
  embeddings.encode(texts, c, devices=jax.local_devices()[:1])
  encoder = names.load_encoder(c.model, embeddings.resolve_cache_dir(c.cache_dir))
  forward = embeddings._forward(encoder.module, False, False)  # pylint: disable=protected-access
  lengths = [len(x) for x in encoder.tokenize(texts, 48)]
  buckets = embeddings.bucket_lengths(48)
  used = {min(b for b in buckets if b >= length) for length in lengths}
  assert forward._cache_size() == len(used) < 10  # pylint: disable=protected-access


def test_same_result_on_one_and_eight_devices(tiny_model_dir, tmp_path):
  assert len(jax.local_devices()) == 8
  texts = make_texts(21, seed=6, hi=60)  # batches of 16 = 2 texts per device, last one padded
  one = embeddings.encode(texts, cfg(tiny_model_dir, str(tmp_path / "one"), batch_size=16),
                          devices=jax.local_devices()[:1])
  eight = embeddings.encode(texts, cfg(tiny_model_dir, str(tmp_path / "eight"), batch_size=16))
  np.testing.assert_allclose(eight, one, atol=1e-5)
  tok1, mask1 = embeddings.encode_tokens(texts, cfg(tiny_model_dir, str(tmp_path / "t1")),
                                         devices=jax.local_devices()[:1])
  tok8, mask8 = embeddings.encode_tokens(texts, cfg(tiny_model_dir, str(tmp_path / "t8")))
  np.testing.assert_array_equal(mask1, mask8)
  np.testing.assert_allclose(tok8.astype(np.float32), tok1.astype(np.float32), atol=2e-3)


def test_token_outputs_match_last_hidden_state_and_masks(tiny_model_dir, reference13, tmp_path):
  vectors, mask = embeddings.encode_tokens(TEXTS13, cfg(tiny_model_dir, str(tmp_path)))
  hidden, want_mask = reference13
  assert vectors.shape == (13, 48, 32) and vectors.dtype == np.float16
  np.testing.assert_array_equal(mask, want_mask)
  np.testing.assert_allclose(vectors.astype(np.float32), hidden * want_mask[..., None],
                             atol=5e-3, rtol=2e-3)
  assert not vectors[~mask].any()
  unit, _ = embeddings.encode_tokens(TEXTS13, cfg(tiny_model_dir, str(tmp_path), normalize=True))
  np.testing.assert_allclose(np.linalg.norm(unit[mask].astype(np.float32), axis=-1), 1.0,
                             atol=2e-3)


def test_cache_is_reused_and_invalidated_by_any_change(tiny_model_dir, tmp_path, count_runs):
  texts = make_texts(10, seed=8)
  base = cfg(tiny_model_dir, str(tmp_path))
  first = embeddings.encode(texts, base)
  second = embeddings.encode(texts, base)
  assert len(count_runs) == 1
  np.testing.assert_array_equal(first, second)
  embeddings.encode(texts[:-1] + [texts[-1] + " gene"], base)
  assert len(count_runs) == 2
  # One pass stores both raw poolings: cls and normalisation are served from the same entry.
  cls = embeddings.encode(texts, cfg(tiny_model_dir, str(tmp_path), pooling="cls"))
  unit = embeddings.encode(texts, cfg(tiny_model_dir, str(tmp_path), normalize=True))
  assert len(count_runs) == 2
  assert not np.allclose(cls, first)
  np.testing.assert_allclose(unit, first / np.linalg.norm(first, axis=1, keepdims=True),
                             rtol=1e-6)
  embeddings.encode(texts, cfg(tiny_model_dir, str(tmp_path), max_length=40))
  assert len(count_runs) == 3
  embeddings.encode_tokens(texts, base)  # token outputs are a different cache entry
  assert len(count_runs) == 4
  embeddings.encode_tokens(texts, cfg(tiny_model_dir, str(tmp_path), normalize=True))
  assert len(count_runs) == 5  # token normalisation is applied in the graph: a new entry
  embeddings.encode_tokens(texts, base)
  embeddings.encode(texts, base)
  assert len(count_runs) == 5
  manifests = sorted(p for p in os.listdir(tmp_path) if p.endswith(".json"))
  assert len(manifests) == 5


def _only_manifest(folder) -> str:
  (name,) = [p for p in os.listdir(folder) if p.endswith(".json")]
  return os.path.join(folder, name)


@pytest.mark.parametrize("damage", ["garbage_npy", "other_values", "pickle_npy", "manifest_key",
                                    "manifest_not_json", "missing_npy"])
def test_corrupt_or_mismatched_cache_is_recomputed(tiny_model_dir, tmp_path, count_runs, damage):
  texts = make_texts(6, seed=9)
  c = cfg(tiny_model_dir, str(tmp_path))
  want = embeddings.encode(texts, c)
  manifest_path = _only_manifest(tmp_path)
  npy_path = manifest_path[:-len(".json")] + ".mean.npy"
  if damage == "garbage_npy":
    with open(npy_path, "wb") as f:
      f.write(b"\x93NUMPY garbage")
  elif damage == "other_values":
    files.atomic_save_npy(npy_path, want + 1.0)
  elif damage == "pickle_npy":
    np.save(npy_path, np.array([{"a": 1}] * len(texts), dtype=object), allow_pickle=True)
  elif damage == "manifest_key":
    with open(manifest_path, encoding="utf-8") as f:
      manifest = json.load(f)
    manifest["key"]["max_length"] += 1
    files.atomic_write_json(manifest_path, manifest)
  elif damage == "manifest_not_json":
    with open(manifest_path, "w", encoding="utf-8") as f:
      f.write("{not json")
  else:
    os.remove(npy_path)
  got = embeddings.encode(texts, c)
  assert len(count_runs) == 2
  np.testing.assert_array_equal(got, want)
  # The recomputed entry is trusted again.
  embeddings.encode(texts, c)
  assert len(count_runs) == 2


def test_cache_dir_default_and_environment(monkeypatch, tmp_path):
  monkeypatch.setenv(embeddings.CACHE_ENV, str(tmp_path / "env"))
  assert embeddings.resolve_cache_dir("") == str(tmp_path / "env")
  assert embeddings.resolve_cache_dir("explicit") == "explicit"
  monkeypatch.delenv(embeddings.CACHE_ENV)
  monkeypatch.setenv("HOME", str(tmp_path))
  assert embeddings.resolve_cache_dir("") == str(tmp_path / ".cache" / "bilinear_ir")


def test_embed_collection_rows_follow_ids(tiny_model_dir, tmp_path):
  collection = Collection(
      name="tiny", doc_ids=["d3", "d1", "d2"], titles=["cancer", "", "heart disease"],
      texts=["tumor growth in mice", "sleep and memory", ""],
      queries={"q2": "sleep memory", "q10": "tumor mice", "q1": "heart"},
      qrels={"test": {"q1": {"d2": 1}}})
  c = cfg(tiny_model_dir, str(tmp_path))
  emb = embeddings.embed_collection(collection, c)
  assert emb.doc_ids == ["d3", "d1", "d2"]
  assert emb.query_ids == ["q1", "q10", "q2"]
  np.testing.assert_allclose(emb.docs, embeddings.encode(collection.doc_strings(), c))
  np.testing.assert_allclose(emb.query_rows(["q2", "q1"]),
                             embeddings.encode(["sleep memory", "heart"], c), atol=1e-6)
  assert emb.manifest["docs"]["key"]["num_texts"] == 3
  with pytest.raises(InputError, match="q99"):
    emb.query_rows(["q99"])
  tok = embeddings.embed_collection_tokens(collection, c, query_max_length=8, doc_max_length=16)
  assert tok.docs.shape == (3, 16, 32) and tok.queries.shape == (3, 8, 32)
  q, m = tok.query_rows(["q10"])
  assert q.shape == (1, 8, 32) and m.sum() == 4  # [CLS] tumor mice [SEP]
  np.testing.assert_array_equal(q, tok.queries[1:2])


def test_bad_encoder_config_raises_input_error(tiny_model_dir, tmp_path):
  texts = ["cancer"]
  with pytest.raises(InputError, match="encoder.pooling"):
    embeddings.encode(texts, cfg(tiny_model_dir, str(tmp_path), pooling="max"))
  with pytest.raises(InputError, match="encoder.max_length"):
    embeddings.encode(texts, cfg(tiny_model_dir, str(tmp_path), max_length=MAX_POS + 1))
  with pytest.raises(InputError, match="encoder.model"):
    embeddings.encode(texts, cfg(str(tmp_path / "no_such_model"), str(tmp_path)))
  with pytest.raises(InputError, match="record 1"):
    embeddings.encode(["cancer", None], cfg(tiny_model_dir, str(tmp_path)))


def test_all_minilm_l6_v2_similar_sentences_score_higher(tmp_path):
  c = encoder_config()
  c.cache_dir = str(tmp_path)
  texts = ["Vitamin D supplementation lowers the risk of bone fractures in older adults.",
           "Older people who take vitamin D have fewer broken bones.",
           "The stock market fell sharply after the central bank raised interest rates.",
           "A new smartphone was released with a larger screen."]
  vectors = embeddings.encode(texts, c)
  assert vectors.shape == (4, 384)
  np.testing.assert_allclose(np.linalg.norm(vectors, axis=1), 1.0, atol=1e-5)
  sims = vectors @ vectors.T
  assert sims[0, 1] > max(sims[0, 2], sims[0, 3], sims[1, 2], sims[1, 3]) + 0.2


def test_empty_text_list_gives_empty_arrays(tiny_model_dir, tmp_path):
  c = cfg(tiny_model_dir, str(tmp_path))
  assert embeddings.encode([], c).shape == (0, 32)
  vectors, mask = embeddings.encode_tokens([], c, max_length=16)
  assert vectors.shape == (0, 16, 32) and mask.shape == (0, 16)
