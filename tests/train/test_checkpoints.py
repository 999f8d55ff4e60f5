"""`train.checkpoints` under an injected fault: the save is refused inside orbax's temporary
folder, which is removed, and the earlier checkpoints are kept."""
import glob
import os

import numpy as np
import pytest

from bilinear_ir import files
from bilinear_ir.errors import WriteError
from bilinear_ir.train import checkpoints


def test_a_refused_save_removes_orbaxs_temporary_folder(tmp_path, monkeypatch):
  ckpts = checkpoints.Checkpoints(str(tmp_path / "ckpt"), every=1, keep=3)
  tree = {"w": np.arange(6, dtype=np.float32)}
  assert ckpts.maybe_save(1, tree, {"step": 1})
  seen = []  # orbax's temporary folders present when the fault fires
  real = files.injected_fault

  def watched(path):
    seen.append(glob.glob(str(tmp_path / "ckpt" / "*.orbax-checkpoint-tmp*")))
    real(path)

  monkeypatch.setattr(files, "injected_fault", watched)
  monkeypatch.setenv("BILINEAR_IR_FAULT", f"ENOSPC:{tmp_path / 'ckpt'}")
  with pytest.raises(WriteError, match="no space left on device writing") as e:
    ckpts.maybe_save(2, tree, {"step": 2})
  assert e.value.path == str(tmp_path / "ckpt" / "2")
  assert seen and all(len(s) == 1 and os.path.basename(s[0]).startswith("2.") for s in seen)
  assert not glob.glob(str(tmp_path / "ckpt" / "*tmp*"))  # removed by the cleanup
  assert sorted(os.listdir(tmp_path / "ckpt")) == ["1"]
  monkeypatch.delenv("BILINEAR_IR_FAULT")
  assert ckpts.maybe_save(2, tree, {"step": 2}) and ckpts.latest_step() == 2
  restored, record = ckpts.restore(tree, 1)
  np.testing.assert_array_equal(restored["w"], tree["w"])
  assert record == {"step": 1}
  ckpts.close()
