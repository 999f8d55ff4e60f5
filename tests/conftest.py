"""pytest setup: 8 fake CPU devices and, on the CPU, XLA optimisation level 0 (both set before jax
is imported), and shared fixtures."""
import os

os.environ.setdefault("JAX_PLATFORMS", "cpu")
# Test programs are small: compiling them dominates, and LLVM's optimisation is most of a compile
# (on the CPU; the accelerator check runs some tests on the default backend, JAX_PLATFORMS="").
os.environ.setdefault("XLA_FLAGS", "--xla_force_host_platform_device_count=8" + (
    " --xla_backend_optimization_level=0" if os.environ["JAX_PLATFORMS"] == "cpu" else ""))
os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TRANSFORMERS_OFFLINE", "1")

import dataclasses  # noqa: E402  pylint: disable=wrong-import-position
import functools  # noqa: E402  pylint: disable=wrong-import-position
import json  # noqa: E402  pylint: disable=wrong-import-position
import socket  # noqa: E402  pylint: disable=wrong-import-position
import subprocess  # noqa: E402  pylint: disable=wrong-import-position
import sys  # noqa: E402  pylint: disable=wrong-import-position

import jax  # noqa: E402  pylint: disable=wrong-import-position
import numpy as np  # noqa: E402  pylint: disable=wrong-import-position
import pytest  # noqa: E402  pylint: disable=wrong-import-position
from safetensors.numpy import save_file  # noqa: E402  pylint: disable=wrong-import-position
from tokenizers import Tokenizer  # noqa: E402  pylint: disable=wrong-import-position
from tokenizers import models  # noqa: E402  pylint: disable=wrong-import-position
from tokenizers import normalizers  # noqa: E402  pylint: disable=wrong-import-position
from tokenizers import pre_tokenizers  # noqa: E402  pylint: disable=wrong-import-position
from tokenizers import processors  # noqa: E402  pylint: disable=wrong-import-position

from bilinear_ir.encoders import hf_folder  # noqa: E402  pylint: disable=wrong-import-position

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


@pytest.fixture(scope="session")
def repo_root() -> str:
  """The repository root (where `configs/` lives)."""
  return REPO


def get_config(job: str, arg: str | None = None):
  """`configs/<job>.py`'s `get_config(arg)` (an unlocked ml_collections.ConfigDict)."""
  import importlib.util  # pylint: disable=g-import-not-at-top
  spec = importlib.util.spec_from_file_location(f"{job}_config",
                                                os.path.join(REPO, "configs", f"{job}.py"))
  module = importlib.util.module_from_spec(spec)
  spec.loader.exec_module(module)
  return module.get_config(arg)


def free_port() -> int:
  """A TCP port of localhost that was free a moment ago (a coordinator address for tests)."""
  with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
    s.bind(("localhost", 0))
    return s.getsockname()[1]


def xla_flags(devices: int = 1) -> str:
  """This session's XLA_FLAGS less its device count (the compile flags), plus a count of
  `devices` CPU devices when `devices` > 1."""
  flags = [f for f in os.environ.get("XLA_FLAGS", "").split()
           if not f.startswith("--xla_force_host_platform_device_count")]
  if devices > 1:
    flags.append(f"--xla_force_host_platform_device_count={devices}")
  return " ".join(flags)


def main_env(devices: int = 1, **extra: str) -> dict:
  """The environment of `python -m bilinear_ir.main` as a user runs it: the CPU, `devices` CPU
  devices (1: no forced count; the session's compile flags kept, see `xla_flags`), this
  checkout first on PYTHONPATH, no injected fault; plus `extra`."""
  env = dict(os.environ)
  env.pop("BILINEAR_IR_FAULT", None)
  env.update(XLA_FLAGS=xla_flags(devices), JAX_PLATFORMS="cpu", PYTHONPATH=REPO)
  env.update(extra)
  return env


def main_command(config: str, workdir, *flags: str,
                 entry: tuple[str, ...] = ("-m", "bilinear_ir.main")) -> list[str]:
  """`python -m bilinear_ir.main --config=CONFIG --workdir=WORKDIR FLAGS...` (`entry`: what
  python runs instead of `-m bilinear_ir.main`, e.g. a script that patches something first)."""
  return [sys.executable, *entry, f"--config={config}", f"--workdir={workdir}", *flags]


@dataclasses.dataclass
class MainRun:
  """One finished run of main: its exit code, output and workdir."""
  returncode: int
  stdout: str
  stderr: str
  workdir: str

  def results(self) -> dict:
    """results.json of a run that exited 0 (the stderr tail in the failure message)."""
    assert self.returncode == 0, self.stderr[-3000:]
    with open(os.path.join(self.workdir, "results.json"), encoding="utf-8") as f:
      return json.load(f)

  def one_error_line(self, *words: str) -> str:
    """Asserts what bad input must give: exit 2, one stderr line "error: ..." holding `words`, no
    traceback, no results.json or results.md; returns the line."""
    lines = [line for line in self.stderr.splitlines() if line.strip()]
    assert self.returncode == 2, f"exit {self.returncode}; stderr:\n{self.stderr[-3000:]}"
    assert len(lines) == 1 and lines[0].startswith("error: "), self.stderr[-3000:]
    assert "Traceback" not in self.stderr + self.stdout
    for word in words:
      assert word in lines[0], f"{word!r} not in {lines[0]!r}"
    for name in ("results.json", "results.md"):
      assert not os.path.exists(os.path.join(self.workdir, name)), name
    return lines[0]


class MainRunner:
  """Runs the one entry point: as a subprocess (`__call__`, `popen`) where the process matters
  (exit codes, stderr, signals, several processes, one device as a user has) or in this process
  (`in_process`, as flax's train_test.py runs its job) where it does not."""

  def __call__(self, config: str, workdir, *flags: str, devices: int = 1, env: dict | None = None,
               timeout: int = 600, entry: tuple[str, ...] = ("-m", "bilinear_ir.main")
               ) -> MainRun:
    proc = subprocess.run(main_command(config, workdir, *flags, entry=entry), cwd=REPO,
                          env=main_env(devices, **(env or {})), capture_output=True, text=True,
                          timeout=timeout, check=False)
    return MainRun(proc.returncode, proc.stdout, proc.stderr, str(workdir))

  def popen(self, config: str, workdir, *flags: str, devices: int = 1,
            env: dict | None = None) -> subprocess.Popen:
    """Started, not waited for (stdout and stderr together in `stdout`)."""
    return subprocess.Popen(main_command(config, workdir, *flags), cwd=REPO,
                            env=main_env(devices, **(env or {})), stdout=subprocess.PIPE,
                            stderr=subprocess.STDOUT, text=True)

  def in_process(self, config: str, workdir, *flags: str) -> dict:
    """Parses the flags as main does, runs `main.run` here (this session's 8 fake devices) and
    returns results.json."""
    from bilinear_ir import main  # pylint: disable=g-import-not-at-top
    argv = ["main", f"--config={os.path.join(REPO, config)}", f"--workdir={workdir}", *flags]
    saved, sys.argv = sys.argv, argv  # ml_collections reads the --config.x overrides there
    main.FLAGS.unparse_flags()
    try:
      main.FLAGS(argv)
      main.run(main.FLAGS.config, main.FLAGS.workdir)
    finally:
      main.FLAGS.unparse_flags()
      for name in [n for n in main.FLAGS if n.startswith("config.")]:
        delattr(main.FLAGS, name)  # the override flags this parse defined
      sys.argv = saved
    with open(os.path.join(workdir, "results.json"), encoding="utf-8") as f:
      return json.load(f)


@pytest.fixture
def run_main() -> MainRunner:
  """Runs `python -m bilinear_ir.main` (see MainRunner)."""
  return MainRunner()


def pytest_report_header(config):  # pylint: disable=unused-argument
  return f"jax {jax.__version__}, devices: {jax.device_count()} x {jax.devices()[0].platform}"


TINY_VOCAB = ("[PAD] [UNK] [CLS] [SEP] [MASK] the a of and in to is for with on by was are "
              "cell cells gene protein cancer risk patients study results increased reduced "
              "treatment disease effect expression level levels human mice blood brain virus "
              "infection drug dose trial data model network retrieval query document similarity "
              "vector matrix rank low high bilinear dot product learned frozen embedding").split()


WORDS = ("the a of and in to is for with on by was are cell cells gene protein cancer risk "
         "patients study results increased reduced treatment disease effect expression level "
         "human mice blood brain virus infection drug dose trial data model").split()
# Special tokens by role, in id order (MPNet's pad id must be 1, as HuggingFace's padding_idx).
SPECIALS = {"bert": {"pad": "[PAD]", "unk": "[UNK]", "cls": "[CLS]", "sep": "[SEP]",
                     "mask": "[MASK]"},
            "mpnet": {"cls": "<s>", "pad": "<pad>", "sep": "</s>", "unk": "[UNK]",
                      "mask": "<mask>"}}

def write_tokenizer(folder: str, kind: str, words=WORDS) -> int:
  """Writes a WordPiece tokenizer.json (+ tokenizer_config.json); returns the vocab size."""
  roles = SPECIALS[kind]
  cls, sep = roles["cls"], roles["sep"]
  tokens = list(roles.values()) + list(words) + ["##s", "##ed", "##ing"]
  vocab = {t: i for i, t in enumerate(tokens)}
  tok = Tokenizer(models.WordPiece(vocab, unk_token=roles["unk"]))
  tok.normalizer = normalizers.BertNormalizer(lowercase=True)
  tok.pre_tokenizer = pre_tokenizers.BertPreTokenizer()
  tok.post_processor = processors.TemplateProcessing(
      single=f"{cls} $A {sep}", pair=f"{cls} $A {sep} $B {sep}",
      special_tokens=[(cls, vocab[cls]), (sep, vocab[sep])])
  tok.add_special_tokens(list(roles.values()))
  tok.save(os.path.join(folder, "tokenizer.json"))
  with open(os.path.join(folder, "tokenizer_config.json"), "w", encoding="utf-8") as f:
    json.dump({"tokenizer_class": "BertTokenizer" if kind == "bert" else "MPNetTokenizer",
               "model_max_length": 512, "do_lower_case": True,
               **{f"{role}_token": token for role, token in roles.items()}}, f)
  return len(vocab)


def write_model(folder: str, kind: str, act: str = "gelu", seed: int = 0, prefix: str = "",
                drop: str | None = None, reshape: str | None = None, words=WORDS,
                max_positions: int = 170) -> str:
  """Writes a tiny random BERT or MPNet folder (2 layers, n 32, 4 heads, usable positions
  `max_positions`).

  Args:
    folder: created if needed.
    kind: "bert" or "mpnet".
    act: hidden_act.
    seed: weights seed.
    prefix: prepended to every weight name ("bert." as BertForMaskedLM checkpoints have).
    drop: a weight name left out of model.safetensors.
    reshape: a weight name stored with one extra row.
    words: the WordPiece vocabulary besides the special tokens.
    max_positions: the longest input in tokens.
  """
  os.makedirs(folder, exist_ok=True)
  vocab = write_tokenizer(folder, kind, words)
  config = {"model_type": kind, "architectures": [f"{kind.upper()}Model"], "vocab_size": vocab,
            "hidden_size": 32, "num_hidden_layers": 2, "num_attention_heads": 4,
            "intermediate_size": 64, "hidden_act": act, "hidden_dropout_prob": 0.1,
            "attention_probs_dropout_prob": 0.1, "initializer_range": 0.02}
  if kind == "bert":
    config.update(max_position_embeddings=max_positions, type_vocab_size=2, layer_norm_eps=1e-12,
                  pad_token_id=0)
  else:
    config.update(max_position_embeddings=max_positions + 2, relative_attention_num_buckets=32,
                  layer_norm_eps=1e-5, pad_token_id=1, bos_token_id=0, eos_token_id=2)
  with open(os.path.join(folder, "config.json"), "w", encoding="utf-8") as f:
    json.dump(config, f)
  arch = hf_folder.ARCHITECTURES[kind]
  module = arch.from_config(config)
  shapes = {name: shape for recipe in arch.recipes(module).values()
            for name, shape in recipe.sources}
  shapes.update({"pooler.dense.weight": (32, 32), "pooler.dense.bias": (32,)})
  rng = np.random.default_rng(seed)
  weights = {}
  for name, shape in sorted(shapes.items()):
    if name == drop:
      continue
    if name == reshape:
      shape = (shape[0] + 1,) + shape[1:]
    w = rng.normal(scale=0.2, size=shape).astype(np.float32)
    if name.endswith("LayerNorm.weight"):
      w += 1.0
    weights[prefix + name] = w
  save_file(weights, os.path.join(folder, "model.safetensors"), metadata={"format": "pt"})
  return folder


def make_tiny_bert(folder: str, seed: int = 0) -> str:
  """Writes a random tiny BERT (safetensors weights, WordPiece tokenizer.json) into `folder`."""
  return write_model(folder, "bert", seed=seed)


@pytest.fixture(scope="session")
def tiny_bert_dir(tmp_path_factory) -> str:
  """A random tiny BERT model folder shared by the tests of a session."""
  return make_tiny_bert(str(tmp_path_factory.mktemp("tiny_bert")))


def write_beir(folder: str, num_docs: int = 40, num_queries: int = 24, seed: int = 0,
               splits: tuple = ("train", "test")) -> str:
  """Writes a small random BEIR-layout collection (corpus, queries, qrels per split)."""
  import json  # pylint: disable=g-import-not-at-top
  import numpy as np  # pylint: disable=g-import-not-at-top
  rng = np.random.default_rng(seed)
  words = TINY_VOCAB[5:]
  os.makedirs(os.path.join(folder, "qrels"), exist_ok=True)
  with open(os.path.join(folder, "corpus.jsonl"), "w", encoding="utf-8") as f:
    for i in range(num_docs):
      text = " ".join(rng.choice(words, size=int(rng.integers(5, 30))))
      f.write(json.dumps({"_id": f"d{i}", "title": f"doc {i}", "text": text}) + "\n")
  with open(os.path.join(folder, "queries.jsonl"), "w", encoding="utf-8") as f:
    for i in range(num_queries):
      f.write(json.dumps({"_id": f"q{i}", "text": " ".join(rng.choice(words, size=4))}) + "\n")
  per = np.array_split(np.arange(num_queries), len(splits))
  for split, qs in zip(splits, per):
    with open(os.path.join(folder, "qrels", f"{split}.tsv"), "w", encoding="utf-8") as f:
      f.write("query-id\tcorpus-id\tscore\n")
      for q in qs:
        for d in rng.choice(num_docs, size=int(rng.integers(1, 3)), replace=False):
          f.write(f"q{q}\td{d}\t1\n")
  return folder


def random_prepared(data_cfg, bm25_cfg, dim: int, seed: int = 0):
  """`data.pipeline.Prepared` of a collection with random [*, dim] embeddings (no encoder)."""
  import numpy as np  # pylint: disable=g-import-not-at-top
  from bilinear_ir.data import embeddings, loaders, pipeline  # pylint: disable=g-import-not-at-top
  coll = loaders.load(data_cfg)
  rng = np.random.default_rng(seed)
  qids = sorted(coll.queries)
  emb = embeddings.Embeddings(
      doc_ids=list(coll.doc_ids), docs=rng.normal(size=(coll.num_docs, dim)).astype(np.float32),
      query_ids=qids, queries=rng.normal(size=(len(qids), dim)).astype(np.float32), manifest={})
  idx, scores, model = pipeline.bm25_ranking(coll, qids, bm25_cfg)
  return pipeline.Prepared(coll, emb, np.asarray(idx), np.asarray(scores, np.float32), model)


@functools.lru_cache
def one_device() -> jax.sharding.Mesh:
  """A data mesh of one device (axis "data"): where a claim is not about sharding, a fine-tune
  step compiles in half the time of the 8-device one."""
  return jax.sharding.Mesh(np.array(jax.devices()[:1]), ("data",),
                           axis_types=(jax.sharding.AxisType.Auto,))


@pytest.fixture(scope="module")
def one_device_training():
  """Trains (`trainer.train`) and fine-tunes (`finetune.fit`) on `one_device()` for the tests of
  a module (`pytestmark = pytest.mark.usefixtures("one_device_training")`): for files whose module
  fixtures run a job and none of whose claims is about sharding."""
  from bilinear_ir.train import finetune, trainer  # pylint: disable=g-import-not-at-top
  with pytest.MonkeyPatch.context() as patch:
    patch.setattr(trainer, "data_mesh", one_device)
    patch.setattr(finetune, "data_mesh", one_device)
    yield


def jit_apply(module, method, params, *args):
  """`module.apply(..., method=method)` jitted (one compile instead of op-by-op dispatch)."""
  return jax.jit(lambda p, *a: module.apply({"params": p}, *a, method=method))(params, *args)


def perturbed_params(module, seed: int = 0):
  """Init params with every array moved by 0.5 N(0, 1) noise (so LayerNorm scales/biases and
  zero-initialised weights matter)."""
  from bilinear_ir.scorers import registry  # pylint: disable=g-import-not-at-top

  @jax.jit
  def init(key):
    params = registry.init_params(module, key)
    leaves, tree = jax.tree.flatten(params)
    keys = jax.random.split(jax.random.fold_in(key, 1), max(len(leaves), 1))
    leaves = [x + 0.5 * jax.random.normal(k, x.shape, x.dtype) for k, x in zip(keys, leaves)]
    return jax.tree.unflatten(tree, leaves)

  return init(jax.random.key(seed))


def expect_located(message: str, file: str, record: str, field: str) -> None:
  """Asserts an error message names the file, the record and (when given) the field."""
  assert file in message, message
  assert record in message, message
  if field:
    assert f"field {field!r}" in message, message
