"""The fine-tuned rows of the late_interaction job (DE, ME-BERT, ColBERT, LITE trained jointly
with the encoder, `studies.late_interaction.finetuned`) on a tiny BEIR folder and a tiny BERT:
the candidates re-encoded by the frozen weights are the cached features, a re-ranking over the
candidates' docs only is the one over all docs, and the job runs the rows end to end through
`main.run` and writes them."""
from __future__ import annotations

import json

import jax
import numpy as np
import pytest

from bilinear_ir import files
from bilinear_ir import main
from bilinear_ir import scorers
from bilinear_ir.encoders import hf_folder
from bilinear_ir.errors import InputError
from bilinear_ir.experiment import spec as spec_lib
from bilinear_ir.jobs import late_interaction as job
from bilinear_ir.report import text
from bilinear_ir.studies.late_interaction import finetuned
from bilinear_ir.studies.late_interaction import setting as setting_lib
from bilinear_ir.train import finetune
from conftest import get_config
from conftest import write_beir

FT_ROWS = ("de_ft", "colbert_ft", "lite_ft", "mebert_ft", "qt_ft")


def tiny_config(tmp_path, tiny_bert_dir):
  c = get_config("late_interaction")
  c.collection = write_beir(str(tmp_path / "beir"), num_docs=60, num_queries=48)
  c.data.dev_fraction = 0.25
  c.encoder.model, c.encoder.cache_dir = tiny_bert_dir, str(tmp_path / "c")
  c.encoder.max_length, c.encoder.query_max_length, c.encoder.doc_max_length = 32, 8, 16
  c.rerank.bm25_depth = c.rerank.random_docs = 10
  c.models.lite_ft.m1, c.models.lite_ft.m2 = 4, 8
  c.models.mebert_ft.proj_dim = c.models.colbert_ft.token_dim = 8
  # One step: each row's train step compiles for one batch shape (a second batch packs to
  # other token counts, one more compile per row); step 0 and step 1 are both dev candidates.
  c.finetune.update(dict(steps=1, eval_every=1, batch_size=8, warmup_steps=0,
                         checkpoint_every=1))
  c.latency.docs, c.latency.repeats, c.latency.rounds = 5, 1, 1
  c.rows, c.distill.scorers = ("dot", "colbert") + FT_ROWS + ("hybrid",), ()
  return c


def test_candidates_encoded_again_by_the_frozen_weights_rank_as_the_cache(tmp_path,
                                                                          tiny_bert_dir):
  c = tiny_config(tmp_path, tiny_bert_dir)
  setting = setting_lib.build_setting(c, spec_lib.collection_block(c.data, c.collection))
  encoder = hf_folder.load_folder(tiny_bert_dir)
  rows = setting.candidate_rows(("dev",))
  assert 0 < len(rows) < setting.prepared.collection.num_docs  # the dev candidates only
  assert set(rows) == set(setting.cands["dev"][setting.cands["dev"] >= 0].tolist())
  docs = setting.prepared.collection.doc_strings()
  colbert = setting.eval_module(scorers.build("colbert", dim=32))
  for tokens in (True, False):
    feats = finetuned.features_of(setting, c, tokens, encoder)
    d = feats.encode(encoder.params, [docs[r] for r in rows], 1)
    q_rows = setting.rows["dev"]
    q = feats.encode(encoder.params, [setting.prepared.collection.queries[
        setting.prepared.embeddings.query_ids[r]] for r in q_rows], 0)
    if tokens:  # float16 states as the token cache's (other batches: float rounding)
      np.testing.assert_array_equal(d[1], setting.tokens.doc_mask[rows])
      np.testing.assert_allclose(d[0], setting.tokens.docs[rows], atol=2e-3)
      np.testing.assert_allclose(q[0], setting.token_queries(q_rows)[0], atol=2e-3)
      module, cached_q, cached_d = colbert, setting.token_queries, setting.token_docs
    else:
      np.testing.assert_allclose(d, setting.prepared.embeddings.docs[rows], atol=1e-5)
      np.testing.assert_allclose(q, setting.pooled_queries(q_rows), atol=1e-5)
      module = scorers.build("dot", dim=32)
      cached_q, cached_d = setting.pooled_queries, setting.prepared.embeddings.docs
    # The cached features of the candidates only, looked up by doc row: the same ranking
    # (doc rows, scores, ties) as from all N docs.
    full = setting.rerank("dev", module, {}, cached_q, cached_d)
    part = setting.rerank("dev", module, {}, cached_q,
                          tuple(x[rows] for x in cached_d) if tokens else cached_d[rows],
                          doc_rows=rows)
    np.testing.assert_array_equal(part[0][0], full[0][0])
    np.testing.assert_array_equal(part[0][1], full[0][1])
    assert part[1] == full[1]
  with pytest.raises(InputError, match="doc_rows"):  # a candidate missing from doc_rows
    setting.rerank("dev", module, {}, cached_q, cached_d[rows[1:]], doc_rows=rows[1:])
  # A fine-tune's features: the frozen weights read the cache; other weights encode the docs
  # asked for, or only those not already encoded by the same weights (merged in row order).
  feats = finetuned.features_of(setting, c, True, encoder)
  get = finetuned.ranker(setting, feats, lambda p: {})
  assert get({"shared": encoder.params}, rows)[2] is None
  tuned = {"shared": jax.tree.map(lambda x: x * 1.01, encoder.params)}
  every = setting.candidate_rows()
  assert len(every) > len(rows)
  _, d_dev, _, _, _, key = get(tuned, rows)
  _, d_all, rows_all, _, _, _ = get(tuned, every)
  _, d_mix, rows_mix, _, _, _ = get(tuned, every, (key, rows, d_dev))
  assert rows_all is every and rows_mix is every
  np.testing.assert_array_equal(d_mix[1], d_all[1])
  np.testing.assert_allclose(d_mix[0], d_all[0], atol=2e-3)
  assert np.abs(d_all[0].astype(np.float32) - setting.tokens.docs[every]).max() > 1e-2
  # A query_tower fine-tune (DE): the doc side is the frozen encoder's, so the cached doc
  # vectors serve as they are (the index never changes) and only the queries are encoded.
  feats = finetuned.features_of(setting, c, False, encoder)
  get = finetuned.ranker(setting, feats, lambda p: {})
  q_fn, d, doc_rows, seconds, _, key = get({"query": tuned["shared"]}, every)
  assert d is setting.prepared.embeddings.docs and doc_rows is None and seconds == 0.0
  assert key == files.tree_sha256(encoder.params)
  texts = [setting.prepared.collection.queries[setting.prepared.embeddings.query_ids[r]]
           for r in q_rows]
  np.testing.assert_array_equal(q_fn(q_rows), feats.encode(tuned["shared"], texts, 0))
  assert np.abs(q_fn(q_rows) - setting.pooled_queries(q_rows)).max() > 1e-3


@pytest.mark.usefixtures("one_device_training")
def test_job_runs_and_writes_the_finetuned_rows(tmp_path, tiny_bert_dir, monkeypatch):
  # Each row trains on one device (no claim here is about sharding: a step compiles in half
  # the time of the 8-device one); the row still names the process's devices.
  c = tiny_config(tmp_path, tiny_bert_dir)
  job.validate(c)
  steps, make = [], finetune.make_train_step
  monkeypatch.setattr(finetune, "make_train_step",
                      lambda *a, **k: steps.append(make(*a, **k)) or steps[-1])
  main.run(c, str(tmp_path / "w"))
  # Each row's compiled train step was let go once the row was done (kept, a row's executables
  # stay resident for the rest of the process: GBs a row on InsuranceQA).
  assert len(steps) == len(FT_ROWS) and all(s._cache_size() == 0 for s in steps)
  res = json.loads((tmp_path / "w" / "results.json").read_text())
  by = {r["row"]: r for r in res["rows"]}
  assert set(FT_ROWS) <= set(by)
  dot = by["dot"]
  md = (tmp_path / "w" / "results.md").read_text()
  for name in FT_ROWS:
    r = by[name]
    assert r["encoder"] == "fine-tuned" and r["trained"] and r["loss"] == "mnrl"
    assert set(r["finetune"]) == {"mode", "steps", "seconds", "device", "reindex_seconds"}
    ft = r["finetune"]
    assert ft["mode"] == ("query_tower" if name == "qt_ft" else "two_tower")
    assert ft["steps"] == 1 and ft["device"] == "8 x cpu" and ft["seconds"] > 0
    # Every candidate doc encoded again with the chosen weights; none when dev chose step 0,
    # nor ever for the query tower (its docs are the frozen index).
    assert (ft["reindex_seconds"] > 0 and 0 < r["reindex_docs"] <= 60) != (
        r["best_step"] == 0 or name == "qt_ft")
    # Selected on dev every step, step 0 (the frozen encoder) a candidate: the row's dev value
    # is its history's best (the first best), and its test values come from those params.
    hist = [h["dev"] for h in r["history"]]
    assert [h["step"] for h in r["history"]] == [0, 1] and r["history"][0]["loss"] is None
    assert r["best_step"] == int(np.argmax(hist))
    assert r["dev"]["ndcg@10"] == pytest.approx(max(hist), abs=1e-9)
    assert r["metrics"]["ndcg@10"] == pytest.approx(np.mean(list(r["per_query"].values())))
    # Compared per query with every other row, each fine-tuned row a baseline (Holm families).
    for other in by.values():
      if other["row"] != name:
        t = other[f"vs_{name}"]
        assert t["diff"] == pytest.approx(np.mean(
            [other["per_query"][q] - r["per_query"][q] for q in r["per_query"]]))
        assert t["p_holm"] >= t["p_perm"]
    assert f"vs_{name}" not in r
  # Each row's fraction of the fine-tuned DE's gain over dot, by hand from the written
  # per-query values, over all test queries and over the unseen-answer ones (no gold doc of a
  # training query); undefined where DE did not gain (a 1-step tiny run may not).
  unseen = res["unseen_queries"]["18"]
  assert 0 < len(unseen) < res["test_queries"]
  for view, queries in (("all", list(dot["per_query"])), ("unseen", unseen)):
    mean = {name: np.mean([r["per_query"][q] for q in queries]) for name, r in by.items()}
    gain = mean["de_ft"] - mean["dot"]
    for name, r in by.items():
      assert set(r["recovered"]) == {"all", "unseen"}
      want = (mean[name] - mean["dot"]) / gain if gain > 0 else None
      assert r["recovered"][view] == pytest.approx(want), (name, view)
      if view == "unseen":
        assert r["unseen"]["mean"] == pytest.approx(mean[name])
  gain = by["de_ft"]["metrics"]["ndcg@10"] - dot["metrics"]["ndcg@10"]
  assert ("fine-tuned DE's gain" in md) and (("did not gain" in md) == (gain <= 0))
  # Step 0 of DE (and of its query tower) is the frozen dual encoder: the dot row's dev value,
  # on the same candidates.
  for name in ("de_ft", "qt_ft"):
    assert by[name]["history"][0]["dev"] == dot["dev"]["ndcg@10"]
    assert by[name]["bytes_per_doc"] == dot["bytes_per_doc"]
  assert by["qt_ft"]["finetune"]["reindex_seconds"] == 0 and by["qt_ft"]["reindex_docs"] == 0
  assert by["colbert_ft"]["stored"] == [16, 8] and by["mebert_ft"]["stored"] == [8, 8]
  assert all(f"| {name} |" in md for name in FT_ROWS)
  # One table of what judged queries buy: the two-tower rows re-encode, the query tower and
  # dot keep the index, the token rows store their own.
  bought = md.split("## What judged queries buy")[1].split("\n## ")[0]
  cells = {line.split(" | ")[0].lstrip("| "): line.split(" | ") for line in bought.splitlines()
           if line.startswith("| ") and not line.startswith("| row ")}
  assert set(cells) == set(by)
  assert cells["qt_ft"][1] == "fine-tuned (query_tower)" and cells["qt_ft"][9] == "unchanged"
  assert cells["dot"][9] == "unchanged" and cells["colbert"][9] == "another store"
  assert cells["de_ft"][9] == "re-encoded" and cells["colbert_ft"][1] == "fine-tuned (two_tower)"
  hybrid = next(r for r in by.values() if r["scorer"] == "hybrid")
  assert cells[hybrid["row"]][9] == cells[hybrid["dense"]][9] + " + BM25"
  for name in by:
    assert cells[name][6:8] == [text.fmt(by[name]["recovered"][v], 2) for v in ("all", "unseen")]
  runs = sorted(p.name.rsplit("-", 1)[0] for p in (tmp_path / "w" / "runs").iterdir())
  assert runs == sorted(f"{name}-n18" for name in FT_ROWS)


def test_finetuned_rows_refuse_a_bad_block(tmp_path, tiny_bert_dir):
  c = tiny_config(tmp_path, tiny_bert_dir)
  c.models.colbert_ft.finetune.mode = "query_tower"
  with pytest.raises(InputError, match="finetune.head"):
    job.validate(c)
  c = tiny_config(tmp_path, tiny_bert_dir)
  c.models.lite_ft.finetune.stepz = 3
  with pytest.raises(InputError, match="models.lite_ft.finetune"):
    job.validate(c)
