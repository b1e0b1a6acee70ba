"""experiments/base/build.py: the same command on the same commit rebuilds the same bytes (a short build, the
`tiny` preset, twice), and the exported folder loads as the model and tokenizer it records."""
import json
import os
import subprocess
import sys

import numpy as np

from experiments.base.build import ROOT


def _build(workdir):
  proc = subprocess.run([sys.executable, os.path.join(ROOT, "experiments/base/build.py"), "--preset=tiny",
                         "--tokenizer_rows=2000", f"--workdir={workdir}"], capture_output=True, text=True, cwd=ROOT)
  assert proc.returncode == 0, proc.stderr[-3000:]
  with open(os.path.join(workdir, "model.json")) as f:
    return json.load(f)


def test_tiny_build_is_bit_exact_and_loads(tmp_path):
  first, second = _build(tmp_path / "a"), _build(tmp_path / "b")
  assert first["files"] == second["files"]                          # every file's SHA-256: weights, tokenizer
  assert set(first["files"]) >= {"config.json", "model.safetensors", "tokenizer.json"}
  assert first["step"] == 6 and first["command"].startswith("python experiments/base/build.py --preset=tiny")
  assert set(first["skills"]) and all(0.0 <= v <= 1.0 for v in first["skills"].values())

  from rlkit.train.models import load_model
  module, params, tok = load_model(str(tmp_path / "a" / "model"))
  assert module.cfg.num_layers == 1 and tok is not None and tok.vocab_size == module.cfg.vocab_size
  assert {np.asarray(x).dtype.name for x in __import__("jax").tree.leaves(params)} == {"bfloat16"}
  ids = tok.encode_batch(["What is 12 plus 7?\n"], add_bos=True)[0]
  assert tok.decode(ids[1:]) == "What is 12 plus 7?\n" and ids[0] == tok.bos_id
