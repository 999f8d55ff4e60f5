r"""embed: write a collection's embeddings to WORKDIR/embeddings/ (the precomputed layout).

  python -m bilinear_ir.main --config=configs/embed.py:encoder=all-mpnet-base-v2,pooling=mean \
      --workdir=runs/embed_mpnet
  # then any job: --config.encoder.kind=precomputed \
  #     --config.encoder.path=runs/embed_mpnet/embeddings

Args (after `:`, comma separated): encoder ("" = all-MiniLM-L6-v2, all-mpnet-base-v2, a model
folder or a hub name), pooling (mean | cls; "" = the model's), normalize (true | false; "" = true
for mean, false for cls), max_length (0 = the model's). `--config.data.format=beir
--config.data.path=DIR` embeds another collection; `--config.encoder.query_prompt=...` sets a
prompt.
"""
from ml_collections import ConfigDict

from bilinear_ir.config import arguments
from bilinear_ir.config import blocks


def get_config(arg=None):
  a = arguments.parse_args(arg, {"encoder": "", "pooling": "mean", "normalize": "",
                                 "max_length": 0})
  c = ConfigDict()
  c.job = "embed"
  c.seed = 0                         # unused (encoding is deterministic); every config has one
  c.data = blocks.data_config()      # which collection (default: the embedded SciFact)
  c.encoder = blocks.encoder_config()
  c.encoder.model = a["encoder"]
  if a["pooling"]:
    c.encoder.pooling = a["pooling"]
    c.encoder.normalize = arguments.optional_bool(a["normalize"], "normalize",
                                                 a["pooling"] == "mean")
  elif a["normalize"]:
    c.encoder.normalize = arguments.optional_bool(a["normalize"], "normalize", False)
  if a["max_length"]:
    c.encoder.max_length = a["max_length"]
  c.distributed = False
  return c
