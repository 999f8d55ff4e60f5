"""Evaluation: IR metrics (equal to trec_eval / pytrec_eval), TREC run and qrels I/O, paired
statistics over queries."""
