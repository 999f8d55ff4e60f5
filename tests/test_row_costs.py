"""benchmarks/row_costs.py on a tiny corpus: the index facts of every row of the learning curve
(the query-side rows add nothing to the raw index, pure P Q^T adds its r floats, MoL its
MolIndex tables) and a JSON with every row at every width. No timed assertion."""
import json
import os
import sys

import jax
import numpy as np

from bilinear_ir.retrieval import mol_topk

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, os.path.join(REPO, "benchmarks"))

import row_costs  # noqa: E402  (benchmarks/row_costs.py)

N, DIM = 300, 48  # DIM > the pure low-rank's r = 32: its doc table is narrower than raw
QUERY_SIDE = ("dot", "wdp", "lowrank_r32", "lowrank_r128", "bilinear", "adapter")


def test_rows_are_the_learning_curves():
  names = [name for name, _ in row_costs.curve_rows()]
  assert names == ["dot", *QUERY_SIDE[1:], "mol", "mol_residual", "lowrank_r32_pure"]
  options = dict(row_costs.curve_rows())
  assert options["lowrank_r128"] == {"scorer": "lowrank", "rank": 128, "residual": "identity"}
  assert options["mol_residual"]["residual"] == "dot" and "residual" not in options["mol"]


def test_index_facts_and_json(tmp_path, capsys):
  out = tmp_path / "costs.json"
  row_costs.main(["--docs", str(N), "--dims", str(DIM), "16", "--batches", "1", "4",
                  "--repeats", "1", "--json", str(out)])
  printed = capsys.readouterr().out
  got = json.loads(out.read_text())
  assert json.loads(printed.strip().splitlines()[-1]) == got  # the printed JSON is the file's
  want = [name for name, _ in row_costs.curve_rows()] + ["numpy dot"]
  for dim in (DIM, 16):
    rows = {r["row"]: r for r in got["rows"] if r["dim"] == dim}
    assert list(rows) == want
    for r in rows.values():
      assert set(r["ms_per_query"]) == {"1", "4"} and r["docs"] == N
  rows = {r["row"]: r for r in got["rows"] if r["dim"] == DIM}
  for name in QUERY_SIDE:
    assert rows[name]["index"] == "raw" and rows[name]["query_side"], name
    assert rows[name]["extra_bytes_per_doc"] == 0, name
    assert rows[name]["raw_bytes_per_doc"] == DIM * 4
  # the residual low-rank's project table is [d, dQ], n + r wide, yet it is served from raw
  assert rows["lowrank_r32"]["doc_arrays"]["doc_table"] == [N, DIM + 32]
  pure = rows["lowrank_r32_pure"]
  assert pure["index"] == "doc table" and pure["extra_bytes_per_doc"] == 32 * 4
  options = dict(row_costs.curve_rows())
  for name in ("mol", "mol_residual"):
    module, params = row_costs.build(options[name], DIM, 0)
    docs = np.random.default_rng(1).standard_normal((N, DIM)).astype(np.float32)
    index = mol_topk.build_index(module, params, docs)
    assert rows[name]["index"] == "MoL tables"
    assert rows[name]["extra_bytes_per_doc"] == (index.items.nbytes + index.avg.nbytes) / N
    assert rows[name]["doc_arrays"] == {"items": list(index.items.shape),
                                        "avg": list(index.avg.shape)}
  # the small width: the pure r = 32 table is not narrower than raw (16), so it is served raw
  small = {r["row"]: r for r in got["rows"] if r["dim"] == 16}
  assert small["lowrank_r32_pure"]["index"] == "raw"
  assert "cores" in got["hardware"] and "threads" in got["hardware"]
  assert jax.devices()  # ran on this process's backend
