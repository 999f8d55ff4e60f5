"""The `fidelity_bm25` job: on a small Collection directly, and end to end through main."""
from __future__ import annotations

import json
import os

import numpy as np
import pytest

from bilinear_ir.data import bm25
from bilinear_ir.data.collection import Collection
from bilinear_ir.errors import InputError
from bilinear_ir.jobs import fidelity_bm25
from bilinear_ir.fidelity import theory
from conftest import get_config



def _get_config(arg: str):
  return get_config("fidelity_bm25", arg)

WORDS = ("insulin resistance muscle diabetes obesity tumour apoptosis damage vitamin fracture "
         "cholesterol statin heart gut microbiome inflammation arthritis cancer screening aspirin "
         "mortality risk cells mice trial dose kidney liver lung brain neuron synapse memory "
         "sleep stress cortisol hormone thyroid bone marrow stem blood pressure artery vein "
         "stroke dementia virus infection vaccine antibody antigen bacteria antibiotic fungus "
         "parasite malaria fever cough asthma allergy skin wound healing collagen protein "
         "enzyme kinase receptor ligand membrane channel calcium sodium potassium glucose "
         "lipid fatty acid amino peptide hormone gene mutation chromosome genome sequencing "
         "transcription translation ribosome mitochondria energy metabolism diet exercise "
         "smoking alcohol pregnancy infant child adult elderly women men placebo cohort").split()


def _texts(seed: int, count: int, lo: int, hi: int) -> list[str]:
  rng = np.random.default_rng(seed)
  return [" ".join(rng.choice(WORDS, size=int(rng.integers(lo, hi)))) for _ in range(count)]


def _collection() -> Collection:
  docs = _texts(0, 40, 6, 60)
  queries = {f"q{i}": t for i, t in enumerate(_texts(1, 12, 2, 6))}
  qrels = {"test": {q: {"d0": 1} for q in queries}}
  return Collection(name="tiny", doc_ids=[f"d{i}" for i in range(40)], titles=[""] * 40,
                    texts=docs, queries=queries, qrels=qrels, source="memory")


def _config(**over):
  c = _get_config("tiny=true")
  c.tokenizer.kind = "bm25s"
  c.k_grid = (8, 16, 32, 64, 128, 256, 512, 1024)
  c.fig2.x_max = 60.0
  c.fig2.num_bins = 3
  c.trials = 12
  for k, v in over.items():
    setattr(c, k, v)
  return c


def _brute_min_margin(model: bm25.SparseModel, queries: list[str]) -> float:
  q = model.query_vectors(queries).toarray()
  d = model.doc_vectors.toarray()
  best = np.inf
  for qi in range(len(q)):
    s = d @ q[qi]
    if s.max() <= 0:
      continue
    t = int(np.argmax(s))
    for j in range(len(d)):
      if s[t] > s[j]:
        best = min(best, theory.normalized_margin(q[qi], d[t], d[j]))
  return best


def test_job_on_a_collection():
  col = _collection()
  config = _config()
  res = fidelity_bm25.run_on(config, col).results
  grid = list(config.k_grid)
  queries = [col.queries[q] for q in sorted(col.queries)]
  tok = bm25.Tokenizer()
  for name, model in (("bm25", bm25.BM25(variant="gensim", tokenizer=tok)),
                      ("boolean", bm25.Boolean(tok))):
    assert res["min_margin"][name] == pytest.approx(
        _brute_min_margin(model.fit(col.doc_strings()), queries), rel=1e-9)
  f2 = res["fig2"]
  assert len(f2["bins"]) == 3 and sum(f2["triples"]) > 0
  pts = []
  for acc, k, xm, bk, n in zip(f2["accuracy"], f2["min_k"], f2["x_mean"], f2["bound_k"],
                               f2["triples"]):
    if not n:
      continue
    assert n <= config.fig2.triples_per_bin
    first = [g for g, a in zip(grid, acc) if a >= 1 - config.beta]
    assert k == (first[0] if first else None)
    assert bk == pytest.approx(8.764 * xm, rel=1e-3)
    # Lemma 1: at eq. (2)'s k the error rate is <= beta, and the bound is loose, so the
    # measured minimum k stays below it (a wrong sign or prefix would break this).
    assert k is not None and k <= bk
    pts.append((xm, k))
  xs, ks = np.array(pts).T
  assert f2["slope"] == pytest.approx((xs * ks).sum() / (xs * xs).sum())
  lc = res["lemma1_check"]
  assert lc["triples"] > 0 and lc["empirical_error"] <= config.beta
  assert lc["trials"] == config.trials
  for panel in ("claims", "containing_passage"):
    b = res["fig3b"][panel]
    assert len(b["bins"]) == len(res["fig3a"][panel]["bins"]) > 0
    for recall, k in zip(b["recall"], b["min_k"]):
      first = [g for g, r in zip(grid, recall) if r >= config.fig3.recall_target]
      assert k == (first[0] if first else None)
  # Deterministic in the seed.
  again = fidelity_bm25.run_on(config, col).results
  assert json.dumps(again, sort_keys=True) == json.dumps(res, sort_keys=True)


def test_bad_config_values_raise():
  with pytest.raises(InputError, match="k_grid"):
    fidelity_bm25.validate(_config(k_grid=(8, 4)))
  with pytest.raises(InputError, match="beta"):
    fidelity_bm25.validate(_config(beta=1.5))


def _write_beir(folder: str) -> None:
  os.makedirs(os.path.join(folder, "qrels"))
  with open(os.path.join(folder, "corpus.jsonl"), "w", encoding="utf-8") as f:
    for i, t in enumerate(_texts(2, 30, 8, 50)):
      f.write(json.dumps({"_id": f"d{i}", "title": "", "text": t}) + "\n")
  with open(os.path.join(folder, "queries.jsonl"), "w", encoding="utf-8") as f:
    for i, t in enumerate(_texts(3, 6, 2, 5)):
      f.write(json.dumps({"_id": f"q{i}", "text": t}) + "\n")
  with open(os.path.join(folder, "qrels", "test.tsv"), "w", encoding="utf-8") as f:
    f.write("query-id\tcorpus-id\tscore\n" + "".join(f"q{i}\td{i}\t1\n" for i in range(6)))


def test_tiny_config_end_to_end_through_main(tmp_path, run_main):
  data = str(tmp_path / "beir")
  _write_beir(data)
  work = str(tmp_path / "work")
  res = run_main.in_process("configs/fidelity_bm25.py:tiny=true", work,
                            "--config.data.format=beir", f"--config.data.path={data}")
  assert {"fig2", "fig3a", "fig3b", "min_margin", "lemma1_check"} <= set(res)
  assert {"bins", "min_k", "bound_k", "slope"} <= set(res["fig2"])
  assert res["collection"]["docs"] == 30 and res["collection"]["queries"] == 6
  assert res["min_margin"]["bm25"] > 0 and res["min_margin"]["boolean"] > 0
  for name in ("fig2.png", "fig3a.png", "fig3b.png", "results.md", "config.json"):
    assert os.path.getsize(os.path.join(work, name)) > 0
  run_main("configs/fidelity_bm25.py:tiny=true", tmp_path / "bad", "--config.data.format=beir",
           f"--config.data.path={tmp_path / 'missing'}").one_error_line("data.path")
