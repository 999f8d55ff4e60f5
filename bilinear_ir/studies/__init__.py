"""Protocol that belongs to one study only, between the jobs and the generic protocol
(`bilinear_ir.experiment`).

  late_interaction      the re-ranking setting of late interaction (LITE paper 004): candidates,
                        rows, teachers, the hybrid over candidates, latency (a package)
  truncation            SVD truncation of a trained full W at every rank (paper 000, section 5)
  approximate_topk      MoL top-k algorithms against brute force (paper 003, Table 5)
  curve_subsets         a learning curve's nested training subsets and unseen-answer queries
  fidelity_experiments  random-projection fidelity to BM25 (paper 002: Fig. 2, 3a, 3b)
  fidelity_tasks        its claims and containing-passage tasks (BM25 vectors, margins, bins)
  agreement_table       the Structured Agreement Ranking Task's table (paper 000, section 4)
"""
