"""Evaluation: metrics (pytrec_eval-equal), TREC run/qrels I/O, report tables and plots."""
