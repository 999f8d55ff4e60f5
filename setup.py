"""bilinear_ir: learned similarity functions for dense retrieval, in JAX/Flax."""
import setuptools

setuptools.setup(
    name="bilinear_ir",
    version="0.1.0",
    description="Learned similarity functions (bilinear, low-rank, MoL, late interaction) "
    "for dense retrieval with frozen embeddings, in JAX/Flax.",
    packages=setuptools.find_packages(include=["bilinear_ir", "bilinear_ir.*"]),
    package_data={"bilinear_ir": ["data/embedded/*"]},
    python_requires=">=3.10",
    install_requires=[
        "jax>=0.10,<0.11",
        "flax>=0.12,<0.13",
        "optax>=0.2.5",
        "orbax-checkpoint>=0.12,<0.13",
        "ml-collections>=1.0",
        "absl-py>=2.1",
        "numpy>=1.26",
        "scipy>=1.13",
        "matplotlib>=3.8",
        "tqdm>=4.66",
        "tensorboardX>=2.6",
        "transformers>=4.45,<5",
        "tensorflow-datasets>=4.9.7",
        "array-record>=0.7",
    ],
    extras_require={
        "dev": [
            "pytest>=8",
            "pytrec-eval-terrier>=0.5.6",
            "faiss-cpu>=1.8",
            "bm25s>=0.2.6",
            "PyStemmer>=2.2",
            "nbformat>=5.9",
            "nbclient>=0.10",
            "ipykernel>=6.29",
        ],
    },
)
