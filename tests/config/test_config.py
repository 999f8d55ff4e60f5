"""bilinear_ir/config: the `k=v` arguments after `:`, the named embeddings, the shared blocks, and
every configs/*.py built from them."""
import os

import ml_collections
import pytest

from bilinear_ir import jobs
from bilinear_ir.config import arguments
from bilinear_ir.config import blocks
from bilinear_ir.config import embedding_specs
from bilinear_ir.errors import InputError
from conftest import REPO, get_config

DEFAULTS = {"quick": False, "seed": 0, "lr": 0.1, "ranks": (8, 32), "names": ("mean",),
            "collection": "scifact"}
CONFIGS = sorted(f[:-3] for f in os.listdir(os.path.join(REPO, "configs")) if f.endswith(".py"))


def test_parse_args_coerces_to_the_default_types():
  got = arguments.parse_args("quick=yes,seed=7,lr=2.5e-3,ranks=2+4+128,names=cls+mean,"
                             "collection=DIR/x.zip", DEFAULTS)
  assert got == {"quick": True, "seed": 7, "lr": 0.0025, "ranks": (2, 4, 128),
                 "names": ("cls", "mean"), "collection": "DIR/x.zip"}
  assert arguments.parse_args("quick=0,ranks=", DEFAULTS)["ranks"] == ()
  assert arguments.parse_args("quick=0", DEFAULTS)["quick"] is False


def test_parse_args_without_argument_is_a_copy_of_the_defaults():
  for arg in (None, "", ","):
    got = arguments.parse_args(arg, DEFAULTS)
    assert got == DEFAULTS and got is not DEFAULTS


@pytest.mark.parametrize("arg,field,words", [
    ("quick=maybe", "quick", "expected a boolean"),
    ("seed=1.5", "seed", "expected int"),
    ("lr=fast", "lr", "expected float"),
    ("ranks=2+x", "ranks", "expected int"),
    ("colour=red", "colour", "known: collection, lr, names, quick, ranks, seed"),
])
def test_bad_argument_names_config_and_field(arg, field, words):
  with pytest.raises(InputError) as e:
    arguments.parse_args(arg, DEFAULTS)
  assert str(e.value).startswith(f"config: field {field!r}: ") and words in str(e.value)


def test_bare_word_is_an_error():
  with pytest.raises(InputError, match="'quick' is not key=value"):
    arguments.parse_args("quick", DEFAULTS)


def test_optional_arguments():
  assert arguments.optional_bool("", "normalize", True) is True
  assert arguments.optional_bool("false", "normalize", True) is False
  assert arguments.optional_ints("", "sizes") == ()
  assert arguments.optional_ints("300+1000", "sizes") == (300, 1000)
  with pytest.raises(InputError, match="field 'sizes'"):
    arguments.optional_ints("300+many", "sizes")


def test_embedding_specs():
  assert embedding_specs.embedding_spec("cls") == {"kind": "flax", "path": "", "pooling": "cls",
                                                   "normalize": False}
  assert embedding_specs.embedding_spec("mpnet-mean")["model"] == "all-mpnet-base-v2"
  assert embedding_specs.embedding_spec("precomputed:runs/e/embeddings") == {
      "kind": "precomputed", "path": "runs/e/embeddings", "normalize": False}
  for bad in ("precomputed:", "max", ""):
    with pytest.raises(InputError, match="config: field 'embeddings': unknown embedding"):
      embedding_specs.embedding_spec(bad)
  assert embedding_specs.describe_embedding("mean") == (
      "all-MiniLM-L6-v2, mean pooling, L2-normalised")
  assert embedding_specs.describe_embedding("cls", "runs/bert") == (
      "runs/bert, cls pooling, unnormalised")
  assert embedding_specs.describe_embedding("precomputed:E") == "precomputed embeddings from E"


def test_blocks_are_fresh_and_table_recipe_fills_every_block():
  a, b = blocks.train_config(), blocks.train_config()
  a.steps = a.steps + 1
  assert b.steps != a.steps  # each call builds a new block: no config shares another's
  c = blocks.table_recipe(ml_collections.ConfigDict())
  assert {"data", "encoder", "bm25", "model", "train", "train_overrides", "hybrid", "eval",
          "stats"} <= set(c)
  assert c.eval.depth == 1000 and set(c.train_overrides) == {"mean", "cls"}


@pytest.mark.parametrize("name", CONFIGS)
def test_every_config_names_its_own_job_and_a_seed(name):
  c = get_config(name)
  assert c.job == name and jobs.get(c.job).__name__ == f"bilinear_ir.jobs.{name}"
  assert isinstance(c.seed, int)


def test_unknown_config_argument_is_an_error_of_the_config():
  with pytest.raises(InputError, match="config: field 'colour'"):
    get_config("reproduce_table", "colour=red")


@pytest.mark.parametrize("arg,field", [("models=adaptr", "models"),
                                       ("negatives=corpse", "negatives")])
def test_an_unknown_table_row_is_refused_naming_its_argument(arg, field):
  """A misspelt entry of the table's extra rows is refused, not read as another row."""
  with pytest.raises(InputError, match=f"config: field '{field}'"):
    get_config("reproduce_table", arg)
  dropped = {"models": lambda n: n in ("adapter", "mol_residual"),
             "negatives": lambda n: n.endswith(("_corpus", "_mined"))}[field]
  assert any(dropped(r["name"]) for r in get_config("reproduce_table").rows)
  assert not any(dropped(r["name"]) for r in get_config("reproduce_table", f"{field}=none").rows)
