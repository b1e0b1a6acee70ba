"""The byte-level BPE tokenizers of experiments/xtok_opd, trained deterministically on the task's language, and what
the alignment sees between the student's tokenizer and the teacher's.

  python experiments/xtok_opd/make_bpe.py DIR [--teacher=PATH]   # DIR/a, DIR/b, then B's alignment with the teacher

Corpus: the texts "prompt" + "answer" ("17+25=42") of the training split a run of seed 0 generates (the task and
data sizes of configs/xtok_opd.py), one corpus for both tokenizers, so B's merges are the first VOCAB_B - 259
of A's and the two differ only where A has merged further ("43" is one token of A, "4" "3" in B). The ByteLevel
pre-tokenizer keeps merges inside numbers, so prompt and answer never share a token. `tokenizers`' trainer is
deterministic (rlkit/models/bpe.py): the same corpus gives the same files byte for byte, and DIR/a, DIR/b equal
the copy the presets read, experiments/xtok_opd/bpe/ (tests/experiments/test_xtok_opd.py). B is the student's
tokenizer; A was the earlier run's teacher's and now serves the `test` preset.

`make_tokenizers(DIR)` writes them, or checks the ones already there: a folder holding other tokenizers is
refused. `alignment_report` says, before any run, what the alignment sees when the student writes its own
tokenization of the held-out answers and the teacher (by default the base, whose tokenizer splits every digit)
reads them through its own.
"""
import argparse
import filecmp
import os
import shutil
import sys

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.dirname(os.path.dirname(HERE)))

from configs.xtok_opd import BASE, VOCAB_A, VOCAB_B, get_config  # noqa: E402

CORPUS_SEED = 0                 # the split of seed 0: one pair of tokenizers for every seed
FILES = ("tokenizer.json", "tokenizer_config.json")


def _splits(seed: int = CORPUS_SEED) -> dict:
  from rlkit.data.splits import generate_splits
  from rlkit.data.tasks import make_task
  c = get_config("student_b")
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


def alignment_report(teacher: str, student: str, seed: int = CORPUS_SEED) -> dict:
  """If the student (tokenizer folder `student`) wrote its own tokenization of each held-out answer of `seed`
  then its stop token: the share of those tokens strictly aligned with the teacher's (`teacher`; the stop token
  always is, with the teacher's EOS), the same share among the answer tokens alone, spans per answer, tokens per
  answer under each, and the tokens the two vocabularies share."""
  import numpy as np

  from rlkit.models.tokenizer import HFTokenizer
  from rlkit.objectives.xtok import align
  t, s = HFTokenizer(teacher), HFTokenizer(student)
  answers = [r["answer"] for r in _splits(seed)["test"]]
  aligned = spans = tokens = 0
  for text in answers:
    mine = s.encode_with_offsets(text)[1]
    got = align(mine, t.encode_with_offsets(text)[1])
    aligned, spans, tokens = aligned + int(got.aligned.sum()), spans + got.n_spans, tokens + len(mine)
  n = len(answers)
  return {"aligned_frac": (aligned + n) / (tokens + n), "aligned_frac_answer": aligned / tokens,
          "spans_per_answer": spans / n, "student_tokens_per_answer": tokens / n,
          "teacher_tokens_per_answer": float(np.mean([len(t.encode(a)) for a in answers])),
          "shared_tokens": len(set(t.get_vocab()) & set(s.get_vocab())), "vocab_teacher": t.vocab_size,
          "vocab_student": s.vocab_size}


def main(argv=None) -> None:
  p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
  p.add_argument("folder", help="where a/ and b/ go")
  p.add_argument("--teacher", default=BASE, help="the teacher's tokenizer folder (default: the base's)")
  args = p.parse_args(argv)
  paths = make_tokenizers(args.folder)
  print(f"tokenizers: {paths['a']} (A), {paths['b']} (B); B against the teacher's {args.teacher}:")
  if not os.path.isdir(args.teacher):
    raise SystemExit(f"make_bpe: no tokenizer folder {args.teacher} (the base is built by experiments/base/build.py); "
                     "pass --teacher=<a tokenizer folder>.")
  for key, value in alignment_report(args.teacher, paths["b"]).items():
    print(f"  {key}: {value:.3f}" if isinstance(value, float) else f"  {key}: {value}")


if __name__ == "__main__":
  main()
