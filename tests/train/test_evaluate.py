"""`rlkit.train.evaluate`: the unbiased pass@k estimator (against exact enumeration, its limits, the n = k
rule) and `evaluate`'s sampling of n samples per prompt in rounds of k."""
import itertools
import json
import math
from types import SimpleNamespace

import jax
import numpy as np
import pytest

from rlkit.data.tasks import make_task
from rlkit.models.tokenizer import CharTokenizer
from rlkit.models.transformer import Transformer, TransformerConfig, init_params
from rlkit.train import evaluate as ev
from rlkit.train.evaluate import evaluate, pass_at_k

TOK = CharTokenizer()


def _enumerated(n, c, k):
  """Share of the k-subsets of n samples (the first c correct) that hold a correct one."""
  subsets = list(itertools.combinations(range(n), k))
  return sum(any(i < c for i in s) for s in subsets) / len(subsets)


@pytest.mark.parametrize("n", range(1, 8))
def test_estimator_equals_exact_enumeration_over_all_k_subsets(n):
  for k in range(1, n + 1):
    for c in range(n + 1):
      assert pass_at_k(n, c, k) == pytest.approx(_enumerated(n, c, k), abs=1e-12), (n, c, k)
      assert pass_at_k(n, c, k) == pytest.approx(1 - math.comb(n - c, k) / math.comb(n, k), abs=1e-12)
  c = np.arange(n + 1)                                   # vectorised over prompts: the same values
  np.testing.assert_allclose(pass_at_k(n, c, 1), c / n, atol=1e-12)


def test_n_equal_k_is_the_any_of_k_rule():
  rng = np.random.default_rng(0)
  for k in (1, 2, 4, 7):
    ok = rng.random((50, k)) < 0.3                      # 50 prompts, k samples each
    np.testing.assert_array_equal(pass_at_k(k, ok.sum(1), k), ok.any(1).astype(float))


def test_limits_zero_without_a_correct_sample_and_one_when_every_subset_holds_one():
  for n, k in [(1, 1), (5, 2), (20, 4), (200, 8), (5000, 100)]:
    assert pass_at_k(n, 0, k) == 0.0
    for c in range(n - k + 1, n + 1):
      assert pass_at_k(n, c, k) == 1.0
  # Large n stays finite and exact where binomials would overflow a float: C(5000, 100) ~ 1e211.
  got = pass_at_k(5000, 40, 100)
  assert 0.0 < got < 1.0 and got == pytest.approx(1 - math.comb(4960, 100) / math.comb(5000, 100), rel=1e-12)


def test_fewer_samples_than_k_is_an_error_naming_the_fix():
  with pytest.raises(ValueError, match=r"k=4, n=3.*eval.pass_n >= eval.pass_k"):
    pass_at_k(3, 1, 4)
  with pytest.raises(ValueError, match="in \\[0, n=3\\]"):
    pass_at_k(3, 4, 2)
  args = dict(batch_size=2, max_prompt_len=4, max_new_tokens=2)
  with pytest.raises(ValueError, match="eval.pass_n=3 < eval.pass_k=4"):
    evaluate(None, None, TOK, None, [{"prompt": "1", "answer": "1"}], jax.random.key(0), pass_k=4, pass_n=3,
             **args)


class _Sampler:
  """Stands in for `generate`: prompt "c" gets its first c samples right (across rounds), greedy always right."""

  def __init__(self, n, k):
    self.k, self.per_chunk, self.rows = k, -(-n // k), []

  def __call__(self, model, params, tokens, mask, key, cfg):
    prompts = [TOK.decode(t[m].tolist()) for t, m in zip(np.asarray(tokens), np.asarray(mask))]
    if cfg.greedy:
      texts = [p for p in prompts]
    else:
      round_ = len(self.rows) % self.per_chunk                           # rounds restart with each chunk
      self.rows.append(len(prompts))
      sample = round_ * self.k + np.arange(len(prompts)) % self.k        # sample index within its prompt
      texts = [p if s < int(p) else "x" for p, s in zip(prompts, sample)]
    ids = [TOK.encode(t) for t in texts]
    response = np.zeros((len(ids), 4), np.int32)
    for i, row in enumerate(ids):
      response[i, :len(row)] = row
    return SimpleNamespace(response=response, lengths=np.array([len(r) for r in ids]))


class _Exact:
  def verify(self, completion, answer):
    return float(completion == answer)


@pytest.mark.parametrize("n,k", [(2, 2), (7, 3), (8, 4), (5, 1)])
def test_evaluate_draws_n_samples_in_rounds_of_k(monkeypatch, n, k):
  counts = [0, 1, 2, 3, 5, 7, 9]                         # correct samples per prompt (clipped to n)
  records = [{"prompt": str(c), "answer": str(c)} for c in counts]
  for batch_size in (4, 7):                              # 4: the last chunk is padded with repeats
    sampler = _Sampler(n, k)
    monkeypatch.setattr(ev, "generate", sampler)
    got = evaluate(None, None, TOK, _Exact(), records, jax.random.key(0), batch_size=batch_size,
                   max_prompt_len=4, max_new_tokens=2, pass_k=k, pass_n=n)
    chunks = -(-len(records) // batch_size)
    assert sampler.rows == [batch_size * k] * (chunks * -(-n // k))    # the sampler's batch never grows
    want = np.mean([pass_at_k(n, min(c, n), k) for c in counts])
    assert got[f"eval/pass@{k}"] == pytest.approx(want, abs=1e-12)
    assert got["eval/accuracy"] == 1.0 and got["eval/num_examples"] == len(records)


def test_evaluate_with_a_real_model_n_equal_k_is_the_default_and_greedy_is_unchanged():
  model = Transformer(TransformerConfig(vocab_size=TOK.vocab_size, hidden_size=32, intermediate_size=48,
                                        num_layers=1, num_heads=2, num_kv_heads=1, head_dim=16,
                                        tie_word_embeddings=True, rope_theta=10_000.0))
  params = init_params(model.cfg, jax.random.key(0))
  task = make_task("arithmetic", ops="+", min_digits=1, max_digits=1)
  rng = np.random.default_rng(0)
  records = [dict(task.make_example(rng)) for _ in range(6)]
  run = lambda n: evaluate(model, params, TOK, task, records, jax.random.key(3), batch_size=4,
                           max_prompt_len=5, max_new_tokens=3, pass_k=2, pass_n=n)
  default, n_is_k, more = run(0), run(2), run(5)
  assert default == n_is_k
  assert more["eval/accuracy"] == default["eval/accuracy"]
  assert more["eval/response_len"] == default["eval/response_len"]
  assert 0.0 <= more["eval/pass@2"] <= 1.0


def test_accuracy_by_category_splits_the_greedy_accuracy(monkeypatch):
  monkeypatch.setattr(ev, "generate", _Sampler(2, 2))
  task = make_task("arithmetic", ops="+-")
  # The stand-in sampler answers every prompt with itself: right exactly where answer == prompt.
  records = [{"prompt": p, "answer": a} for p, a in
             (("1+2", "1+2"), ("3+4", "x"), ("5-1", "5-1"), ("7-2", "5-1"), ("9-9", "9-9"))]
  exact = SimpleNamespace(verify=_Exact().verify, category=task.category, name="arithmetic")
  for batch_size in (2, 5):                               # a padded last chunk counts once
    got = evaluate(None, None, TOK, exact, records, jax.random.key(0), batch_size=batch_size, max_prompt_len=4,
                   max_new_tokens=4, pass_k=0, by_category=True)
    assert got["eval/accuracy/+"] == 0.5 and got["eval/accuracy/-"] == pytest.approx(2 / 3)
    assert got["eval/accuracy"] == pytest.approx(3 / 5)
  with pytest.raises(ValueError, match="defines no category"):
    evaluate(None, None, TOK, _Exact(), records, jax.random.key(0), batch_size=2, max_prompt_len=4,
             max_new_tokens=4, pass_k=0, by_category=True)


def test_jsonl_categories_come_from_a_category_field(tmp_path):
  path = tmp_path / "d.jsonl"
  path.write_text('{"prompt": "a", "answer": "1", "category": "algebra"}\n{"prompt": "b", "answer": "2"}\n')
  task = make_task("jsonl", path=str(path))
  from rlkit.data.pipeline import decode_record
  assert [task.category(decode_record(r)) for r in task.rows] == ["algebra", "none"]
  assert task.category(task.rows[0]) == "algebra"


def _verdict_sampler(verdicts):
  """A stand-in `generate` that answers each prompt with verdicts[prompt text]."""
  def answer(model, params, tokens, mask, key, cfg):
    prompts = [TOK.decode(t[m].tolist()) for t, m in zip(np.asarray(tokens), np.asarray(mask))]
    ids = [TOK.encode(verdicts[p]) for p in prompts]
    response = np.zeros((len(ids), 8), np.int32)
    for i, row in enumerate(ids):
      response[i, :len(row)] = row
    return SimpleNamespace(response=response, lengths=np.array([len(r) for r in ids]))
  return answer


def test_processbench_f1_is_an_eval_metric_summed_over_chunks(monkeypatch):
  """The task hook (`eval_counts`, `eval_metrics`): ProcessBench F1 of the greedy verdicts equals the metric
  computed directly on the predicted indices, whatever the chunking."""
  from rlkit.data.processbench import final_answer_baseline, synthetic_processbench
  from rlkit.rewards.prm import parse_answer, predicted_index, processbench_metrics
  task = make_task("processbench_chains")
  records = synthetic_processbench(0, 6)
  # Half the rows get the true step verdicts, half the final-answer baseline's: every subset has misses.
  verdicts = {r["prompt"]: task.demonstration(r) if i % 2 else final_answer_baseline(r)
              for i, r in enumerate(records)}
  monkeypatch.setattr(ev, "generate", _verdict_sampler(verdicts))
  labels = [parse_answer(r["answer"]) for r in records]
  pred = [predicted_index(verdicts[r["prompt"]], n) for r, (_, n) in zip(records, labels)]
  want = processbench_metrics([r["subset"] for r in records], pred, [label for label, _ in labels])
  assert 0 < want["f1"] < 100
  for batch_size in (5, 24):                             # 5: a padded last chunk
    got = evaluate(None, None, TOK, task, records, jax.random.key(0), batch_size=batch_size, max_prompt_len=64,
                   max_new_tokens=8, pass_k=0)
    assert got["eval/processbench/f1"] == pytest.approx(want["f1"])
    assert got["eval/processbench/len7/acc_err"] == pytest.approx(want["len7/acc_err"])
    assert got["eval/accuracy"] == pytest.approx(np.mean([p == label for p, (label, _) in zip(pred, labels)]))
    plain = [i for i, r in enumerate(records) if not r["trap"]]
    nontrap = processbench_metrics([records[i]["subset"] for i in plain], [pred[i] for i in plain],
                                   [labels[i][0] for i in plain])
    assert got["eval/processbench_nontrap/f1"] == pytest.approx(nontrap["f1"])
    traps = [pred[i] == labels[i][0] for i, r in enumerate(records) if r["trap"]]
    assert traps and got["eval/processbench_traps/accuracy"] == pytest.approx(np.mean(traps))


def test_processbench_files_are_scored_whole_with_every_subset_unless_limited(tmp_path, monkeypatch, capsys):
  """A converted ProcessBench file holds its subsets one after the other: the first eval.num_examples rows were
  GSM8K's only. The `processbench` task is scored on every row (eval.num_examples does not apply), reporting
  each subset's F1 and their mean; eval_limit N keeps the first N rows of each subset and says so."""
  from rlkit.data.processbench import OFFICIAL_SUBSETS
  from rlkit.data.processbench_convert import main as convert
  from rlkit.data.tfds_builders import prepare_jsonl
  from rlkit.rewards.prm import parse_answer, predicted_index, processbench_metrics
  official = tmp_path / "official"
  official.mkdir()
  labels = [-1, 0, 1, 2, -1, 1]
  for q, subset in enumerate(OFFICIAL_SUBSETS):
    rows = [{"id": f"{subset}-{j}", "problem": f"Problem {subset} {j}?", "steps": ["a", "b", "c"],
             "final_answer_correct": label == -1, "label": label} for j, label in enumerate(labels)]
    (official / f"{subset}.jsonl").write_text("\n".join(json.dumps(r) for r in rows))
  path = str(tmp_path / "pb.jsonl")
  convert(["--official", str(official), "--out", path])
  test = prepare_jsonl({"train": path, "test": path}, str(tmp_path / "data"))["test"]   # stored records (bytes)
  task = make_task("processbench", path=path)
  rows = [dict(r) for r in task.rows]
  # Subset q gets the true verdict on its first q + 2 rows and "---" (step 0 is wrong) on the rest: the subsets
  # score differently (F1 33.3, 50, 60, 85.7), so one subset's mean cannot pass for the mean over four.
  verdicts = {r["prompt"]: task.demonstration(r) if int(r["id"].rsplit("-", 1)[1]) < q + 2 else "---"
              for q, s in enumerate(OFFICIAL_SUBSETS) for r in rows if r["subset"] == s}
  monkeypatch.setattr(ev, "generate", _verdict_sampler(verdicts))

  def want(kept):
    pred = [predicted_index(verdicts[r["prompt"]], len(r["steps"])) for r in kept]
    return processbench_metrics([r["subset"] for r in kept], pred, [parse_answer(r["answer"])[0] for r in kept])

  def scores(records):
    return evaluate(None, None, TOK, task, records, jax.random.key(0), batch_size=5, max_prompt_len=128,
                    max_new_tokens=8, pass_k=0)

  assert len(ev.evaluated_records(make_task("jsonl", path=path), test, 4)) == 4   # other tasks: num_examples
  records = ev.evaluated_records(task, test, 4)
  assert len(records) == len(test) == 24 and "limited" not in capsys.readouterr().out
  got, full = scores(records), want(rows)
  f1s = [full[f"{s}/f1"] for s in OFFICIAL_SUBSETS]
  assert len(set(f1s)) == 4 and got["eval/num_examples"] == 24
  for s in OFFICIAL_SUBSETS:
    for metric in ("f1", "acc_err", "acc_cor"):
      assert got[f"eval/processbench/{s}/{metric}"] == pytest.approx(full[f"{s}/{metric}"])
  assert got["eval/processbench/f1"] == pytest.approx(np.mean(f1s))
  assert got["eval/processbench/f1"] != pytest.approx(want(rows[:4])["f1"])     # not the first rows' number

  limited = make_task("processbench", path=path, eval_limit=2)
  records = ev.evaluated_records(limited, test, 4)
  assert "(limited to 8 of 24 examples: the first 2 of each of 4 categories" in capsys.readouterr().out
  kept = [r for r in rows if int(r["id"].rsplit("-", 1)[1]) < 2]
  assert [ev.as_text_record(r)["fields"]["id"] for r in records] == [r["id"] for r in kept]
  got = scores(records)
  assert got["eval/num_examples"] == 8
  assert got["eval/processbench/f1"] == pytest.approx(want(kept)["f1"])
  assert {k.split("/")[2] for k in got if k.endswith("/f1") and k.count("/") == 3} == set(OFFICIAL_SUBSETS)
  with pytest.raises(ValueError, match="eval_limit must be an integer >= 0"):
    make_task("processbench", path=path, eval_limit=-1)
