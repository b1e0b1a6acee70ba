"""experiments/xtok_opd/make_bpe.py: the committed tokenizers the presets read are what it trains, and a folder
of other tokenizers is refused rather than overwritten (runs that read it would change tokenizer on resume)."""
import filecmp
import os

import pytest

from configs.xtok_opd import BPE_DIR, TOKENIZERS, VOCAB_A, VOCAB_B
from experiments.xtok_opd.make_bpe import FILES, alignment_report, make_tokenizers


def test_the_presets_tokenizers_are_what_make_bpe_trains_and_other_tokenizers_are_refused(tmp_path):
  paths = make_tokenizers(str(tmp_path))          # (one training for both checks: it is most of the cost)
  assert set(paths) == set(TOKENIZERS) == {"a", "b"}
  for name in paths:
    for f in FILES:
      assert filecmp.cmp(os.path.join(paths[name], f), os.path.join(BPE_DIR, name, f), shallow=False), (name, f)
  assert make_tokenizers(str(tmp_path)) == paths                 # again: checked, kept
  report = alignment_report(paths)
  assert (report["vocab_a"], report["vocab_b"]) == (VOCAB_A, VOCAB_B) and report["shared_tokens"] == VOCAB_B
  assert 0.3 < report["aligned_frac"] < 0.9 and report["spans_per_answer"] > 0.2   # room for both modes
  assert report["a_tokens_per_answer"] < report["b_tokens_per_answer"]
  with open(os.path.join(paths["b"], "tokenizer.json"), "a") as f:
    f.write(" ")
  with pytest.raises(FileExistsError, match=r"holds another tokenizer than make_bpe trains now"):
    make_tokenizers(str(tmp_path))
