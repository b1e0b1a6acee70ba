"""Packed SFT batches (sft.pack): full rows of whole examples in order, the loss mask per loss_on, exact resume,
per-process rows of one global batch."""
import numpy as np
import pytest

from rlkit.data.packing import make_packed_sft_iterator
from rlkit.data.pipeline import sft_batch
from rlkit.data.tasks import make_task
from rlkit.models.tokenizer import CharTokenizer

TOK = CharTokenizer()


@pytest.fixture(scope="module")
def rows():
  task, rng = make_task("arithmetic", ops="+-", max_digits=3), np.random.default_rng(0)
  return [dict(r, demonstration=task.demonstration(r)) for r in (task.make_example(rng) for _ in range(64))]


def _take(it, n):
  return [next(it) for _ in range(n)]


def test_rows_are_full_and_hold_the_examples_in_shuffled_order(rows):
  batches = _take(make_packed_sft_iterator(rows, 4, 0, TOK, 24), 3)
  stream = np.concatenate([b["tokens"].reshape(-1) for b in batches])
  assert all(b["tokens"].shape == (4, 24) and b["attention_mask"].all() for b in batches)
  assert TOK.pad_id not in stream                          # no padding anywhere: every row is full
  # Cut the stream at BOS: each piece is one example, [BOS] prompt answer EOS, whole or cut by the end.
  starts = np.flatnonzero(stream == TOK.bos_id)
  pieces = [stream[a:b] for a, b in zip(starts, starts[1:])]
  texts = {r["prompt"] + r["answer"] for r in rows}
  assert len(pieces) > 8
  for piece in pieces:
    assert piece[-1] == TOK.eos_id and TOK.decode(piece[1:-1].tolist()) in texts


@pytest.mark.parametrize("loss_on", ["completion", "all"])
def test_loss_mask_marks_the_targets(rows, loss_on):
  batch = next(make_packed_sft_iterator(rows, 2, 1, TOK, 40, loss_on=loss_on))
  tokens, mask = batch["tokens"].reshape(-1), batch["loss_mask"].reshape(-1)
  if loss_on == "all":
    assert mask.all()
  else:                                                     # answer digits and EOS; never BOS or the prompt
    assert not mask[tokens == TOK.bos_id].any() and mask[tokens == TOK.eos_id].all()
    assert not mask[tokens == TOK.encode("=")[0]].any() and 0 < mask.mean() < 1


def test_resume_from_state_is_exact(rows):
  it = make_packed_sft_iterator(rows, 4, 2, TOK, 24)
  _take(it, 7)                                              # mid-example: rows split examples
  state = it.get_state()
  expected = _take(it, 6)                                   # past the end of the 64 examples: the next epoch
  resumed = make_packed_sft_iterator(rows, 4, 2, TOK, 24)
  resumed.set_state(state)
  for a, b in zip(_take(resumed, 6), expected):
    for k in a:
      np.testing.assert_array_equal(a[k], b[k])


def test_processes_take_their_rows_of_the_global_batch(rows):
  whole = _take(make_packed_sft_iterator(rows, 4, 3, TOK, 24), 3)
  parts = [_take(make_packed_sft_iterator(rows, 4, 3, TOK, 24, process_index=p, process_count=2), 3)
           for p in range(2)]
  for i in range(3):
    np.testing.assert_array_equal(np.concatenate([parts[0][i]["tokens"], parts[1][i]["tokens"]]),
                                  whole[i]["tokens"])


def test_bad_arguments_are_refused(rows):
  with pytest.raises(ValueError, match="loss_on"):
    make_packed_sft_iterator(rows, 4, 0, TOK, 24, loss_on="prompt")
  with pytest.raises(ValueError, match="max_len >= 2"):
    make_packed_sft_iterator(rows, 4, 0, TOK, 1)
  with pytest.raises(ValueError, match="empty"):
    make_packed_sft_iterator([], 4, 0, TOK, 24)


def test_unpacked_loss_on_all_marks_every_real_token(rows):
  batch = sft_batch(rows[:3], TOK, 16, loss_on="all")
  np.testing.assert_array_equal(batch["loss_mask"], batch["attention_mask"])


def test_a_packed_stage_checks_lengths_without_generating_its_training_split():
  """sft.pack reads the training examples only as packed rows: validation neither generates them (a pretraining
  corpus is large) nor limits their length; the test split's prompts still set data.max_prompt_len."""
  import configs.grpo_arith
  from rlkit.data.splits import generate_splits
  from rlkit.train.lengths import needed_lengths, split_rows
  from rlkit.train.models import run_tokenizer

  c = configs.grpo_arith.get_config("test")
  c.stages = ("sft",)
  c.sft.pack, c.sft.max_len = True, 4                    # shorter than any example: fine when packed
  task = make_task("arithmetic", **c.task.kwargs.to_dict())
  assert split_rows(c, with_train=False) == {"test": generate_splits(task, 50, c.data.num_test, c.seed)["test"]}
  needed = needed_lengths(c, run_tokenizer(c))
  assert set(needed) == {"data.max_prompt_len"} and "test split" in needed["data.max_prompt_len"][1]
  c.sft.pack = False
  assert needed_lengths(c, run_tokenizer(c))["sft.max_len"][0] > 4
