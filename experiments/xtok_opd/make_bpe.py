"""The two byte-level BPE tokenizers of experiments/xtok_opd, trained deterministically on the task's language.

  python experiments/xtok_opd/make_bpe.py DIR      # DIR/a (VOCAB_A tokens), DIR/b (VOCAB_B), then the report

Corpus: the texts "prompt" + "answer" ("17+25=42") of the training split a run of seed 0 generates (the task and
data sizes of configs/xtok_opd.py), one corpus for both tokenizers, so B's merges are the first VOCAB_B - 259
of A's and the two differ only where A has merged further ("43" is one token of A, "4" "3" in B). The ByteLevel
pre-tokenizer keeps merges inside numbers, so prompt and answer never share a token. `tokenizers`' trainer is
deterministic (rlkit/models/bpe.py): the same corpus gives the same files byte for byte, and DIR/a, DIR/b equal
the copy the presets read, experiments/xtok_opd/bpe/ (tests/experiments/test_xtok_opd.py).

`make_tokenizers(DIR)` writes them, or checks the ones already there: a folder holding other tokenizers is
refused, so a resumed experiment never reads text through new merges. `alignment_report` says, before any
run, what the alignment sees when the student writes B's own tokenization of the held-out answers.
"""
import argparse
import filecmp
import os
import shutil
import sys

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.dirname(os.path.dirname(HERE)))

from configs.xtok_opd import VOCAB_A, VOCAB_B, get_config  # noqa: E402

CORPUS_SEED = 0                 # the split of seed 0: one pair of tokenizers for every seed
FILES = ("tokenizer.json", "tokenizer_config.json")


def _splits(seed: int = CORPUS_SEED) -> dict:
  from rlkit.data.splits import generate_splits
  from rlkit.data.tasks import make_task
  c = get_config("student_sft")
  return generate_splits(make_task(c.task.name, **c.task.kwargs), c.data.num_train, c.data.num_test, seed)


def corpus(seed: int = CORPUS_SEED) -> list:
  """The training texts the tokenizers learn from: each training example's prompt followed by its answer."""
  return [r["prompt"] + r["answer"] for r in _splits(seed)["train"]]


def make_tokenizers(folder: str) -> dict:
  """{"a": FOLDER/a, "b": FOLDER/b}, trained (VOCAB_A, VOCAB_B tokens) unless already there; raises if a folder
  there holds different files or the corpus gave fewer tokens than asked."""
  from rlkit.models.bpe import save_tokenizer_folder, train_bpe
  texts, out = corpus(), {}
  for name, size in (("a", VOCAB_A), ("b", VOCAB_B)):
    tok = train_bpe(texts, size)
    if tok.get_vocab_size() != size:
      raise ValueError(f"make_bpe: the corpus gave {tok.get_vocab_size()} tokens for tokenizer {name}, not {size}; "
                       "lower VOCAB_A / VOCAB_B in configs/xtok_opd.py.")
    path, fresh = os.path.join(folder, name), os.path.join(folder, f".{name}.new")
    shutil.rmtree(fresh, ignore_errors=True)
    save_tokenizer_folder(tok, fresh)
    if os.path.isdir(path):
      same = all(os.path.isfile(os.path.join(path, f)) and filecmp.cmp(os.path.join(path, f), os.path.join(fresh, f),
                                                                          shallow=False) for f in FILES)
      shutil.rmtree(fresh)
      if not same:
        raise FileExistsError(f"make_bpe: {path} holds another tokenizer than make_bpe trains now (a changed corpus, "
                              "vocab size or `tokenizers` version); runs that read it would change tokenizer when "
                              "resumed. Use a new folder (a new --root), or delete it and every run that read it.")
    else:
      os.replace(fresh, path)
    out[name] = path
  return out


def alignment_report(paths: dict, seed: int = CORPUS_SEED) -> dict:
  """If the student wrote B's own tokenization of each held-out answer of `seed` then its stop token: the share
  of those tokens strictly aligned with A's (the stop token always is, with A's EOS), spans per answer, tokens per
  answer under each, and the tokens A and B share."""
  import numpy as np

  from rlkit.models.tokenizer import HFTokenizer
  from rlkit.objectives.xtok import align
  a, b = HFTokenizer(paths["a"]), HFTokenizer(paths["b"])
  answers = [r["answer"] for r in _splits(seed)["test"]]
  aligned = spans = tokens = 0
  for text in answers:
    student = b.encode_with_offsets(text)[1]
    got = align(student, a.encode_with_offsets(text)[1])
    aligned, spans, tokens = aligned + int(got.aligned.sum()) + 1, spans + got.n_spans, tokens + len(student) + 1
  return {"aligned_frac": aligned / tokens, "spans_per_answer": spans / len(answers),
          "b_tokens_per_answer": tokens / len(answers) - 1,
          "a_tokens_per_answer": float(np.mean([len(a.encode(t)) for t in answers])),
          "shared_tokens": len(set(a.get_vocab()) & set(b.get_vocab())), "vocab_a": a.vocab_size,
          "vocab_b": b.vocab_size}


def main(argv=None) -> None:
  p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
  p.add_argument("folder", help="where a/ and b/ go")
  args = p.parse_args(argv)
  paths = make_tokenizers(args.folder)
  print(f"tokenizers: {paths['a']} (A), {paths['b']} (B)")
  for key, value in alignment_report(paths).items():
    print(f"  {key}: {value:.3f}" if isinstance(value, float) else f"  {key}: {value}")


if __name__ == "__main__":
  main()
