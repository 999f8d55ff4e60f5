"""What a reader sees of a job's results: markdown, findings and figures.

`outputs` is what a job hands back to `main` (`Report`) and how main writes it; `text` formats
table cells, markdown tables and the fixed prose of `templates/<job>.md`; one module per job that
has more than a line to say (`reproduce_table`, `mol`, `study`, `learning_curve`,
`late_interaction`, `lowrank_analysis`, `fidelity_bm25`, `synthetic_agreement`) turns its results
into markdown, findings and figures. Jobs import this package; it imports none of them.
"""
