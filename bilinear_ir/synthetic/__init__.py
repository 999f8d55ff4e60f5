"""The Structured Agreement Ranking Task (paper 000, section 4).

`task` defines instances, documents, scoring and success (with Wilson intervals); `training` fits
scorers on it with the margin ranking loss; `feasibility` answers with a linear program whether one
universal weight vector / matrix solves every critical pair. The job that runs the experiment is
`bilinear_ir/jobs/synthetic_agreement.py`; `studies/agreement_table.py` holds its rows (constructed, universal and
fixed-I0 models on shared test instances).
"""
