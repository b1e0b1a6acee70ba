"""Held-out evaluation: greedy accuracy and pass@k on a fixed slice of the test split.

Greedy accuracy is the share of prompts whose argmax completion the verifier accepts. pass@k samples n >= k
completions per prompt at temperature 1, counts the c the verifier accepts, and averages over prompts the
unbiased estimator of Chen et al. 2021 ("Evaluating Large Language Models Trained on Code", the Codex paper):

    pass@k = 1 - C(n - c, k) / C(n, k) = 1 - prod_{i = n - c + 1}^{n} (1 - k / i)

the probability that k of the n samples drawn without replacement include a correct one. The product form
never forms a binomial coefficient, so it stays exact in float64 for any n. With n = k it is the direct rule
(solved if any of the k samples is accepted); a larger n gives the same expectation with less variance. The
evaluated prompts are always the first `eval.num_examples` records of the test split, so numbers are
comparable across steps, stages and runs, except for a task that scores a whole benchmark (it has an
`eval_limit`, see `evaluated_records`: ProcessBench, whose headline averages subsets that its file holds one
after the other, so the first records would be one subset's). With `by_category` (config `eval.by_category`)
the greedy accuracy is also reported per category of the task's `category(example)` (arithmetic: the
operators), as `eval/accuracy/<category>`: which skill a policy gains or loses.

A task may add its own corpus metrics (ProcessBench's F1, rlkit/data/processbench.py) through two optional
methods: `eval_counts(record, completion) -> {name: float}`, counts of one greedy completion that add up over
records (the same names for a record whatever the completion), and `eval_metrics(totals) -> {name: float}`,
the metrics from the summed counts, logged as `eval/<name>`. Counts, not per-row values, cross processes, so
a multi-process evaluation sums them before dividing and gets the one-process numbers.
"""
from __future__ import annotations

from typing import Any, Callable, Optional, Sequence

import jax
import numpy as np

from rlkit.data.pipeline import as_text_record, prompt_batch
from rlkit.models.tokenizer import decode_responses
from rlkit.parallel.hosts import host_rows, process_sum
from rlkit.rollout.sampler import SamplingConfig, generate


def pass_at_k(n: int, num_correct: Any, k: int) -> np.ndarray:
  """Unbiased pass@k of each prompt from n samples of which `num_correct` (int or int array) were accepted.

  1 - C(n - c, k) / C(n, k) in its product form (module docstring): 0 where c = 0, exactly 1 where
  n - c < k (every k-subset holds a correct sample). Raises ValueError unless 1 <= k <= n and 0 <= c <= n.
  """
  if not 1 <= k <= n:
    raise ValueError(f"pass@k needs 1 <= k <= n samples per prompt, got k={k}, n={n}: set eval.pass_n >= "
                     f"eval.pass_k (0 means n = k).")
  c = np.asarray(num_correct)
  if np.any((c < 0) | (c > n)):
    raise ValueError(f"pass@k: correct counts {c} must lie in [0, n={n}].")
  i = np.arange(1, n + 1, dtype=np.float64)
  # Factor i enters for i > n - c; the factor i = k is 0, so n - c < k gives exactly 1.
  factors = np.where(i > (n - c)[..., None], 1.0 - k / i, 1.0)
  return 1.0 - np.prod(factors, axis=-1)


def evaluated_records(task: Any, test: Sequence, num_examples: int) -> list:
  """The records an evaluation scores: the first `num_examples` (eval.num_examples) of the test split.

  A task that scores a whole benchmark says so with an `eval_limit` attribute (the `processbench` task's
  kwarg), and eval.num_examples does not apply to it: eval_limit 0 takes every record, N the first N of each
  of its categories (`task.category`: ProcessBench's subsets, so a limited run still averages every subset),
  and a note says that the numbers are not the whole benchmark's.
  """
  limit = getattr(task, "eval_limit", None)
  if limit is None:
    return [test[i] for i in range(min(num_examples, len(test)))]
  records = [test[i] for i in range(len(test))]
  if not limit:
    return records
  taken: dict[str, int] = {}
  kept = []
  for record in records:
    category = task.category(as_text_record(record))
    if taken.get(category, 0) < limit:
      taken[category] = taken.get(category, 0) + 1
      kept.append(record)
  if len(kept) < len(records) and jax.process_index() == 0:
    print(f"note: task {task.name!r} evaluation (limited to {len(kept)} of {len(records)} examples: the first "
          f"{limit} of each of {len(taken)} categories, task.kwargs.eval_limit={limit}; 0 scores the whole set, "
          "as the benchmark does)", flush=True)
  return kept


def _chunks(records: Sequence[dict], size: int):
  """Fixed-size chunks (the last one padded with repeats, so the sampler compiles once)."""
  for start in range(0, len(records), size):
    chunk = list(records[start:start + size])
    real = len(chunk)
    chunk += [chunk[-1]] * (size - real)
    yield chunk, real


def evaluate(model: Any, params: Any, tokenizer: Any, task: Any, records: Sequence[dict], key: jax.Array, *,
             batch_size: int, max_prompt_len: int, max_new_tokens: int, pass_k: int,
             pass_n: int = 0, put_batch: Optional[Callable[[dict], dict]] = None,
             by_category: bool = False, log_samples: int = 0, samples: Optional[list] = None
             ) -> dict[str, float]:
  """Greedy accuracy, mean response length and (pass_k > 0) `eval/pass@{pass_k}` from pass_n samples per prompt.

  With `samples` (a list) and `log_samples` > 0, the first `log_samples` greedy rows this process verified are
  appended to it as `{"prompt", "completion", "answer", "correct"}` (the rows a run shows; process 0's are the
  first records of the set): they come from the greedy pass that the accuracy counts, so showing them costs
  no sampling.

  pass_n = 0 means n = k. The samples are drawn in rounds of k per prompt (the sampler's batch stays
  batch_size * k whatever n is, and n = k draws exactly the samples it always did); a last partial round's
  extra samples are dropped unverified. Multi-process: each process verifies its slice of every chunk of
  `batch_size` prompts (`put_batch` makes the global batch), so the numbers equal a one-process run's.
  """
  if pass_k < 0 or pass_n < 0 or log_samples < 0:
    raise ValueError(f"eval.pass_k={pass_k}, eval.pass_n={pass_n} and eval.log_samples={log_samples} must be "
                     ">= 0.")
  n = pass_n or pass_k
  if pass_k and n < pass_k:
    raise ValueError(f"eval.pass_n={pass_n} < eval.pass_k={pass_k}: pass@k needs n >= k samples per prompt; "
                     f"set eval.pass_n >= {pass_k}, or 0 for n = k.")
  if by_category and not callable(getattr(task, "category", None)):
    raise ValueError(f"eval.by_category=True, but the task {getattr(task, 'name', task)!r} defines no "
                     "category(example); set eval.by_category=False.")
  records = [as_text_record(r) for r in records]
  if not records:
    return {}
  batch_size = min(batch_size, len(records))
  procs, me = jax.process_count(), jax.process_index()
  if batch_size % procs:
    raise ValueError(f"eval.batch_size={batch_size} (or eval.num_examples, if smaller) must divide into the "
                     f"{procs} processes.")
  put = put_batch or (lambda b: b)
  local = batch_size // procs        # each process runs its slice of every chunk; the global batch is the chunk
  greedy = SamplingConfig(max_new_tokens=max_new_tokens, greedy=True, stop_ids=tokenizer.stop_ids,
                          pad_id=tokenizer.pad_id)
  sample = SamplingConfig(max_new_tokens=max_new_tokens, temperature=1.0, stop_ids=tokenizer.stop_ids,
                          pad_id=tokenizer.pad_id)

  def texts_of(prompt_tokens, prompt_mask, key, cfg):
    dev = put({"prompt": prompt_tokens, "mask": prompt_mask})
    out = generate(model, params, dev["prompt"], dev["mask"], key, cfg)
    lengths = host_rows(out.lengths)
    return decode_responses(tokenizer, host_rows(out.response), lengths), lengths

  counts_of = getattr(task, "eval_counts", None)
  if counts_of is not None and not callable(getattr(task, "eval_metrics", None)):
    raise ValueError(f"task {getattr(task, 'name', task)!r} defines eval_counts but no eval_metrics(totals); "
                     "define both, or neither.")
  correct, solved, lengths, categories, counts = [], [], [], [], {}
  for i, (chunk, real) in enumerate(_chunks(records, batch_size)):
    mine = chunk[me * local:(me + 1) * local]
    real = max(0, min(real - me * local, local))          # this process's real (unpadded) rows
    batch = prompt_batch(mine, tokenizer, max_prompt_len)
    texts, out_lengths = texts_of(batch["prompt_tokens"], batch["prompt_mask"], key, greedy)
    verdicts = [task.verify(t, r["answer"]) for t, r in zip(texts[:real], mine[:real])]
    if samples is not None and len(correct) < log_samples:
      samples += [{"prompt": r["prompt"], "completion": t, "answer": r["answer"], "correct": bool(ok)}
                  for t, r, ok in zip(texts, mine, verdicts)][:log_samples - len(correct)]
    correct += verdicts
    lengths += out_lengths[:real].tolist()
    if by_category:
      categories += [task.category(r) for r in mine[:real]]
    if counts_of is not None:
      for t, r in zip(texts[:real], mine[:real]):
        for name, value in counts_of(r, t).items():
          counts[name] = counts.get(name, 0.0) + float(value)
    if pass_k:
      rep = np.repeat(np.arange(len(mine)), pass_k)
      chunk_key = jax.random.fold_in(key, i + 1)
      hits = np.zeros(real, np.int64)
      for r in range(-(-n // pass_k)):
        take = min(pass_k, n - r * pass_k)             # samples kept per prompt from this round
        texts, _ = texts_of(batch["prompt_tokens"][rep], batch["prompt_mask"][rep],
                            chunk_key if r == 0 else jax.random.fold_in(chunk_key, r), sample)
        texts = np.array(texts, object).reshape(len(mine), pass_k)
        hits += [sum(bool(task.verify(t, mine[j]["answer"])) for t in texts[j, :take]) for j in range(real)]
      solved += pass_at_k(n, hits, pass_k).tolist()
  count, n_correct, n_tokens, n_solved = process_sum([len(correct), np.sum(correct), np.sum(lengths),
                                                      np.sum(solved)])
  metrics = {"eval/accuracy": float(n_correct / count), "eval/response_len": float(n_tokens / count),
             "eval/num_examples": int(count)}
  if pass_k:
    metrics[f"eval/pass@{pass_k}"] = float(n_solved / count)
  if by_category:     # every process holds every record, so all see the same category names
    names = sorted({task.category(r) for r in records})
    hits = np.zeros((2, len(names)))
    for ok, c in zip(correct, categories):
      hits[:, names.index(c)] += (ok, 1)
    hits = np.asarray(process_sum(list(hits.reshape(-1)))).reshape(2, -1)
    metrics.update({f"eval/accuracy/{c}": float(h / n) for c, h, n in zip(names, *hits) if n})
  if counts_of is not None:   # the names of every record's counts, so all processes sum the same vector
    names = sorted({name for r in records for name in counts_of(r, "")})
    totals = process_sum([counts.get(name, 0.0) for name in names])
    metrics.update({f"eval/{k}": float(v) for k, v in task.eval_metrics(dict(zip(names, totals))).items()})
  return metrics
