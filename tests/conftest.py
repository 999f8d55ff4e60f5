"""pytest setup: 8 fake CPU devices (set before jax is imported) and shared fixtures."""
import os

os.environ.setdefault("XLA_FLAGS", "--xla_force_host_platform_device_count=8")
os.environ.setdefault("JAX_PLATFORMS", "cpu")
os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TRANSFORMERS_OFFLINE", "1")

import jax  # noqa: E402  pylint: disable=g-import-not-at-top,wrong-import-position
import pytest  # noqa: E402  pylint: disable=g-import-not-at-top,wrong-import-position

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


@pytest.fixture(scope="session")
def repo_root() -> str:
  """The repository root (where `configs/` lives)."""
  return REPO


def pytest_report_header(config):  # pylint: disable=unused-argument
  return f"jax {jax.__version__}, devices: {jax.device_count()} x {jax.devices()[0].platform}"


TINY_VOCAB = ("[PAD] [UNK] [CLS] [SEP] [MASK] the a of and in to is for with on by was are "
              "cell cells gene protein cancer risk patients study results increased reduced "
              "treatment disease effect expression level levels human mice blood brain virus "
              "infection drug dose trial data model network retrieval query document similarity "
              "vector matrix rank low high bilinear dot product learned frozen embedding").split()


def make_tiny_bert(folder: str, seed: int = 0, hidden: int = 32, layers: int = 2) -> str:
  """Writes a random tiny BERT (Flax weights, vocab, fast tokenizer) into `folder`."""
  import transformers  # pylint: disable=g-import-not-at-top
  os.makedirs(folder, exist_ok=True)
  vocab = os.path.join(folder, "vocab.txt")
  with open(vocab, "w", encoding="utf-8") as f:
    f.write("\n".join(TINY_VOCAB) + "\n")
  cfg = transformers.BertConfig(vocab_size=len(TINY_VOCAB), hidden_size=hidden,
                                num_hidden_layers=layers, num_attention_heads=4,
                                intermediate_size=2 * hidden, max_position_embeddings=128)
  model = transformers.FlaxBertModel(cfg, seed=seed)
  model.save_pretrained(folder)
  transformers.BertTokenizerFast(vocab_file=vocab, do_lower_case=True).save_pretrained(folder)
  return folder


@pytest.fixture(scope="session")
def tiny_bert_dir(tmp_path_factory) -> str:
  """A random tiny BERT model folder shared by the tests of a session."""
  return make_tiny_bert(str(tmp_path_factory.mktemp("tiny_bert")))


def write_beir(folder: str, num_docs: int = 40, num_queries: int = 24, seed: int = 0,
               splits: tuple = ("train", "test")) -> str:
  """Writes a small random BEIR-layout collection (corpus, queries, qrels per split)."""
  import json  # pylint: disable=g-import-not-at-top
  import numpy as np  # pylint: disable=g-import-not-at-top
  rng = np.random.default_rng(seed)
  words = TINY_VOCAB[5:]
  os.makedirs(os.path.join(folder, "qrels"), exist_ok=True)
  with open(os.path.join(folder, "corpus.jsonl"), "w", encoding="utf-8") as f:
    for i in range(num_docs):
      text = " ".join(rng.choice(words, size=int(rng.integers(5, 30))))
      f.write(json.dumps({"_id": f"d{i}", "title": f"doc {i}", "text": text}) + "\n")
  with open(os.path.join(folder, "queries.jsonl"), "w", encoding="utf-8") as f:
    for i in range(num_queries):
      f.write(json.dumps({"_id": f"q{i}", "text": " ".join(rng.choice(words, size=4))}) + "\n")
  per = np.array_split(np.arange(num_queries), len(splits))
  for split, qs in zip(splits, per):
    with open(os.path.join(folder, "qrels", f"{split}.tsv"), "w", encoding="utf-8") as f:
      f.write("query-id\tcorpus-id\tscore\n")
      for q in qs:
        for d in rng.choice(num_docs, size=int(rng.integers(1, 3)), replace=False):
          f.write(f"q{q}\td{d}\t1\n")
  return folder


def random_prepared(data_cfg, bm25_cfg, dim: int, seed: int = 0):
  """`data.pipeline.Prepared` of a collection with random [*, dim] embeddings (no encoder)."""
  import numpy as np  # pylint: disable=g-import-not-at-top
  from bilinear_ir.data import embeddings, loaders, pipeline  # pylint: disable=g-import-not-at-top
  coll = loaders.load(data_cfg)
  rng = np.random.default_rng(seed)
  qids = sorted(coll.queries)
  emb = embeddings.Embeddings(
      doc_ids=list(coll.doc_ids), docs=rng.normal(size=(coll.num_docs, dim)).astype(np.float32),
      query_ids=qids, queries=rng.normal(size=(len(qids), dim)).astype(np.float32), manifest={})
  idx, scores, model = pipeline.bm25_ranking(coll, qids, bm25_cfg)
  return pipeline.Prepared(coll, emb, np.asarray(idx), np.asarray(scores, np.float32), model)


def jit_apply(module, method, params, *args):
  """`module.apply(..., method=method)` jitted (one compile instead of op-by-op dispatch)."""
  return jax.jit(lambda p, *a: module.apply({"params": p}, *a, method=method))(params, *args)


def perturbed_params(module, seed: int = 0):
  """Init params with every array moved by 0.5 N(0, 1) noise (so LayerNorm scales/biases and
  zero-initialised weights matter)."""
  from bilinear_ir.scorers import registry  # pylint: disable=g-import-not-at-top

  @jax.jit
  def init(key):
    params = registry.init_params(module, key)
    leaves, tree = jax.tree.flatten(params)
    keys = jax.random.split(jax.random.fold_in(key, 1), max(len(leaves), 1))
    leaves = [x + 0.5 * jax.random.normal(k, x.shape, x.dtype) for k, x in zip(keys, leaves)]
    return jax.tree.unflatten(tree, leaves)

  return init(jax.random.key(seed))
