"""Retrieval: exact top-k over doc tables (chunked, streamed, sharded, multi-host), the on-disk
doc index, certified low-rank / low-precision retrieval (a FAISS index: `export.faiss_index`).

    from bilinear_ir.retrieval import exact
    res = exact.topk(query_table, doc_table, k=10)   # TopK(scores [B, k], ids [B, k])

Modules: `exact` (chunked scan + running top-k merge, streaming, multi-vector max),
`sharded` (shard_map over a device mesh; per-process split + merge), `index` (DocIndex: `.npy`
shards + manifest), `serving` (reuse or build an index, then search it), `certified` (rank-r
scan + Theorem 3 certificate; bf16 scan + float32 rescoring), `ranking` (rank and evaluate a
scorer's run: full corpus or re-ranking), `hybrid` (sparse-dense fusion), `candidates`
(re-ranking candidates), `mol_topk` (Mixture-of-Logits top-k). Timing and the hardware line are in
`bilinear_ir.timing`; the FAISS index (the only module importing faiss) in `bilinear_ir.export`.
"""
