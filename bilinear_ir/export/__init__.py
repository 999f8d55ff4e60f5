"""Exports: a trained similarity out of the project, one module per format.

`saved_model` (the project's own `config.json` + `model.safetensors`, what `retrieve` and
`export` load), `sentence_transformers` (a `SentenceTransformer` folder), `encoder_folder` (a
fine-tuned encoder as a sentence-transformers folder in the HuggingFace layout), `head` (the two
table matrices alone), `faiss_index` (a FAISS inner-product index over a doc table; the only
module that imports faiss, an extra).
"""
