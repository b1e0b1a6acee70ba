"""The `rquest` stage (OUR DESIGN, methods/llm.md §5): a proposer writes practice questions, the stage's policy
(the solver) learns from them. The rewards and the memory bank: rlkit/rewards/rquest.py; the checker and the
fingerprints: rlkit/rewards/question_checker.py; the question language as a task: rlkit/data/questions.py.

One iteration, with P = prompts_per_step examples read from the train data, Q = rquest.group, G = group_size:
  propose   the proposer (a trainable config.models role, rquest.proposer) writes Q expressions for each
            example's `bindings` ("a=3,b=5:"): N = P*Q questions `bindings + expression`. These questions are
            the solver's prompts this iteration: the data source its RL reads.
  check     the checker (`analyse_question`, in the reward executor's worker): validity and its reason, the
            exact answer, the skill and instance fingerprints; a question whose tokens do not fit the solver's
            prompt (data.max_prompt_len) is invalid ("length") and its answers count for nothing
  judge     (rquest.judge_samples = J > 0) the proposer's reject head writes J verdicts V/I on "question?"; with
            rquest.reject_filter, a draft most verdicts call invalid is dropped before the solver learns from it
  solve     the solver samples G answers per question; p̂ = the share agreeing with the majority answer
  score     the proposer reward (PROPOSER_REWARDS[rquest.reward]): `rquest` = v·(u − λ_dup·d) − λ_inv·(1 − v)
            with v the checker and the consensus, d the fingerprint (rquest.level) in the bank or earlier in the
            batch; `rzero` = u − λ_rep·(the batch's surface trigram repetition): no checker, no memory
  learn     the proposer on its N questions (advantage groups of Q); the reject head on the N*J verdicts (groups
            of J, reward 1 when the verdict is the checker's); the solver on the questions the proposer reward
            lets through (groups of G, reward 1 when the answer equals the label: the majority answer, R-Zero's
            pseudo-label, or with rquest.labels='checker' the exact answer); other questions' rows are masked
  remember  the checker-valid questions' fingerprints enter the bank, their exact texts the `seen` bank

State: the solver's slice at the top level (`train`, ...), the proposer's under `proposer`, the banks under
`rquest` (fixed-shape numpy arrays, in every checkpoint: a resumed stage sees the memory an uninterrupted one
would). Metrics: the solver's as in the `rl` stage, over the rows it learns from (its `accuracy`: agreement
with the labels), the two proposer updates' prefixed `proposer/` and `judge/`, and `rquest/...`
(`question_metrics`). The evaluation is the solver's, on the task's held-out questions. One process: the banks
and the question flow are host state.
"""
from __future__ import annotations

import hashlib

import jax
import jax.numpy as jnp
import ml_collections
import numpy as np

from rlkit.data.pipeline import prompt_batch, token_lengths
from rlkit.parallel.hosts import host_rows
from rlkit.rewards import RewardOutput, take
from rlkit.rewards import question_checker as checker
from rlkit.rewards import rquest as rq
from rlkit.train import rl_stage, weight_sync
from rlkit.core.errors import ConfigError
from rlkit.train.rl_config import rl_defaults
from rlkit.train.phases.augment import Augmenter
from rlkit.train.phases.reward import reward_batch
from rlkit.train.rl_metrics import policy_metrics
from rlkit.train.stages import Stage, loop, register_stage

LABELS = ("majority", "checker")
WATCHED = ("length", "parse", "unbound", "unused", "trivial", "range")   # reasons with their own metric


def rquest_defaults() -> ml_collections.ConfigDict:
  c = rl_defaults()
  c.kind = "rquest"             # stage kind (registry STAGES)
  c.prompts_per_step = 8        # examples read per iteration; their `bindings` are the proposer's prompts
  c.group_size = 4              # solver answers per question (p̂ is their agreement)
  c.max_new_tokens = 6          # solver answer tokens
  c.rquest = ml_collections.ConfigDict()   # the proposer, its reward, the memory bank, the reject head
  c.rquest.proposer = "proposer"  # the config.models role (trainable=True) that writes the questions
  c.rquest.group = 8            # questions per proposer prompt: the proposer's advantage group
  c.rquest.max_new_tokens = 12  # proposer tokens per expression
  c.rquest.reward = "rquest"    # proposer reward (registry PROPOSER_REWARDS): rquest | rzero
  c.rquest.lam_dup = 0.5        # rquest: cost of a known fingerprint
  c.rquest.lam_inv = 0.5        # rquest: cost of an invalid question
  c.rquest.tau_cons = 0.25      # rquest: least solver agreement p̂ of a valid question
  c.rquest.lam_rep = 1.0        # rzero: weight of the surface repetition
  c.rquest.rep_threshold = 0.5  # rzero: trigram Jaccard similarity from which two questions repeat
  c.rquest.level = "skill"      # fingerprint level of d(q): skill (the function) | instance (with the values)
  c.rquest.bank_capacity = 8192  # fingerprints remembered (the oldest last-seen are evicted past it)
  c.rquest.max_age = 0          # forget fingerprints not seen for this many iterations (0: never)
  c.rquest.max_value = 1000     # the checker's |answer| limit
  c.rquest.labels = "majority"  # the solver's label: majority (R-Zero's pseudo-label) | checker (exact answer)
  c.rquest.judge_samples = 0    # reject head: verdicts per draft (0: no reject head)
  c.rquest.reject_filter = True  # drafts most verdicts call invalid do not train the solver
  return c


def _section(cfg, **fields):
  """A copy of the stage section with `fields` replaced: the RL settings of one of the proposer's updates."""
  out = ml_collections.ConfigDict(cfg.to_dict())
  for key, value in fields.items():
    out[key] = value
  return out


def proposer_sections(cfg) -> dict:
  """prefix -> the section of each proposer update: questions (groups of Q) and, with J > 0, verdicts (groups
  of J, one token). Their optimizer schedule spans every proposer update of the stage."""
  r, n = cfg.rquest, cfg.prompts_per_step * cfg.rquest.group
  steps = cfg.steps * (2 if r.judge_samples else 1)
  out = {"proposer/": _section(cfg, group_size=r.group, max_new_tokens=r.max_new_tokens, steps=steps,
                               prompts_per_step=cfg.prompts_per_step)}
  if r.judge_samples:
    out["judge/"] = _section(cfg, group_size=r.judge_samples, max_new_tokens=1, steps=steps, prompts_per_step=n)
  return out


def _text_hash(texts) -> np.ndarray:
  return np.array([int.from_bytes(hashlib.blake2b("".join(t.split()).encode(), digest_size=8).digest(), "little")
                   for t in texts], np.uint64)


def _canonical(answer):
  if answer is None:
    return None
  try:
    return str(int(answer))
  except ValueError:
    return None


def _reward(values) -> RewardOutput:
  values = np.asarray(values, np.float64)
  return RewardOutput(rewards=values, correct=values > 0.5, components={}, failures={})


def _init(ctx, cfg, params):
  if jax.process_count() > 1:
    raise ConfigError("the rquest stage runs on one process: its question flow and memory banks are host state.")
  r, proposer = cfg.rquest, ctx.models[cfg.rquest.proposer]
  if proposer.module.cfg.vocab_size != ctx.model.cfg.vocab_size:
    raise ConfigError(f"models.{r.proposer} has a vocabulary of {proposer.module.cfg.vocab_size}, the solver "
                      f"{ctx.model.cfg.vocab_size}: the solver reads the proposer's tokens, so both need one tokenizer.")
  need = 12 + r.max_new_tokens + 2                   # BOS, the longest bindings "a=10,b=99:" and expression, "="
  if ctx.config.data.max_prompt_len < need:
    raise ConfigError(f"data.max_prompt_len={ctx.config.data.max_prompt_len} cannot hold a question of the rquest "
                      f"stage (bindings + rquest.max_new_tokens={r.max_new_tokens} tokens + '='); set it to >= {need}.")
  state = rl_stage.init_policy_state(ctx, cfg, params)
  state["proposer"] = rl_stage.init_policy_state(ctx, proposer_sections(cfg)["proposer/"],
                                                 jax.tree.map(jnp.copy, proposer.params), proposer.module,
                                                 own_reference=True)
  state["rquest"] = {"bank": rq.bank_init(r.bank_capacity), "seen": rq.bank_init(r.bank_capacity)}
  return state


def question_metrics(analysis, dup, hidden, agree, majority, trains, scores, bank) -> dict:
  """rquest/...: invalid (share the checker rejects) and invalid/<reason>, duplicate and hidden_duplicate
  (shares of the valid questions whose fingerprint is known, and known though the exact text is not),
  unique (fingerprints in the bank), frontier (mean u of the valid), agreement, solver_rows (share of questions
  the solver learns from), label_correct (the majority answer is the exact one, on valid questions that train
  the solver), reward (mean proposer reward)."""
  valid, n = analysis["valid"], len(dup)
  nv = max(int(valid.sum()), 1)
  right = np.array([m is not None and m == str(a) for m, a in zip(majority, analysis["answer"])])
  out = {"rquest/invalid": 1.0 - valid.mean(),
         **{f"rquest/invalid/{k}": sum(x == k for x in analysis["reason"]) / n for k in WATCHED},
         "rquest/duplicate": float((dup & valid).sum() / nv), "rquest/hidden_duplicate": float((hidden & valid).sum() / nv),
         "rquest/unique": int(bank.cursor), "rquest/frontier": float((rq.frontier(agree) * valid).sum() / nv),
         "rquest/agreement": float(agree.mean()), "rquest/solver_rows": float(trains.mean()),
         "rquest/reward": float(scores.mean())}
  labelled = valid & trains
  out["rquest/label_correct"] = float((right & labelled).sum() / max(int(labelled.sum()), 1))
  return out


class _Iteration:
  """The stage's iteration (module docstring) over learners built once: the solver and the proposer's updates."""

  def __init__(self, ctx, cfg, state, executor):
    self.ctx, self.cfg, self.r, self.executor = ctx, cfg, cfg.rquest, executor
    proposer = ctx.models[cfg.rquest.proposer]
    self.solver = rl_stage.Learner(ctx, cfg, state, None, augmenter=Augmenter(0))
    self.sections = proposer_sections(cfg)
    self.learners = {p: rl_stage.Learner(ctx, s, state["proposer"], None, model=proposer.module,
                                         augmenter=Augmenter(0)) for p, s in self.sections.items()}
    self.score = rq.PROPOSER_REWARDS.get(cfg.rquest.reward)

  def _prompts(self, texts):
    records = [{"prompt": t, "answer": "", "fields": {}} for t in texts]
    return prompt_batch(records, self.ctx.tokenizer, self.ctx.config.data.max_prompt_len)

  def _sample(self, learner, policy, texts, key, group):
    """`group` completions per text from the policy state `policy` (its sampler copy with rl.sync)."""
    params = weight_sync.sampling_source(policy.get(weight_sync.SAMPLER), policy["train"].params)
    s = learner.collect(learner.sampler_model, params, self._prompts(texts), key, learner.sampling, group,
                        self.ctx.put_batch, perturb=learner.perturb)
    return s, reward_batch(s, self.ctx.tokenizer).completions

  def _check(self, texts):
    max_chars = self.ctx.config.data.max_prompt_len - 2
    rows = [(t, self.r.max_value, max_chars) for t in texts]
    out = self.executor.map(checker.analyse_question, rows, fallback=checker.ANALYSIS_FALLBACK)
    return checker.unpack_analyses(out.values), out.failures

  def _fits(self, texts) -> np.ndarray:
    """bool[N]: the question with "=" fits the solver's prompt (data.max_prompt_len tokens). A proposer's
    max_new_tokens tokens of a BPE tokenizer can decode to a text that tokenizes longer (a char tokenizer's
    cannot), and the checker limits characters only."""
    lengths, _ = token_lengths([{"prompt": t + "=", "answer": ""} for t in texts], self.ctx.tokenizer)
    return np.array(lengths) <= self.ctx.config.data.max_prompt_len

  def _judge(self, policy, texts, valid, key):
    """Verdicts of the reject head: (samples, rewards, said-valid per draft)."""
    learner, j = self.learners["judge/"], self.r.judge_samples
    samples, verdicts = self._sample(learner, policy, [rq.judge_prompt(t) for t in texts], key, j)
    said = [rq.parse_judgment(v) for v in verdicts]
    rewards = rq.reject_reward(said, np.repeat(valid, j))
    votes = np.array([s is True for s in said]).reshape(-1, j).sum(1)
    return samples, _reward(rewards), votes * 2 >= j

  def __call__(self, state, batch, key, iterator, step):
    del iterator
    r, cfg, metrics = self.r, self.cfg, {}
    bindings = [f["bindings"] for f in batch["fields"]]
    state = self.solver.ready(state)
    prop = self.learners["proposer/"].ready(state["proposer"])
    drafts, expressions = self._sample(self.learners["proposer/"], prop, bindings,
                                       jax.random.fold_in(key, 1), r.group)
    texts = [e["prompt"] + x.strip() for e, x in zip(drafts.examples, expressions)]
    analysis, failed = self._check(texts)
    # A question the solver cannot read is invalid ("length"); the solver answers its bindings alone instead,
    # and those answers count for nothing (no agreement, no label, no row to learn from).
    fits = self._fits(texts)
    analysis["valid"] = valid = analysis["valid"] & fits
    analysis["reason"] = [r if ok else "length" for r, ok in zip(analysis["reason"], fits)]
    keep = np.ones(len(texts), bool)
    if r.judge_samples:
      judged, judge_rewards, said_valid = self._judge(prop, texts, valid, jax.random.fold_in(key, 2))
      metrics.update({"reject/accuracy": float(judge_rewards.rewards.mean()),
                      "reject/dropped": float((~said_valid).mean()),
                      "reject/caught": float((~said_valid & ~valid).sum() / max(int((~valid).sum()), 1))})
      if r.reject_filter:
        keep = said_valid
    solved, answers = self._sample(self.solver, state, [(t if ok else e["prompt"]) + "=" for t, ok, e in
                                                        zip(texts, fits, drafts.examples)],
                                   jax.random.fold_in(key, 3), cfg.group_size)
    extracted = [_canonical(self.ctx.task.extract_answer(a)) if fits[i // cfg.group_size] else None
                 for i, a in enumerate(answers)]
    majority, agree = rq.solver_agreement([extracted[i:i + cfg.group_size]
                                           for i in range(0, len(extracted), cfg.group_size)])
    banks = state["rquest"]
    fps = analysis[r.level]
    now, age = (step, r.max_age) if r.max_age else (None, None)
    dup = rq.duplicate_flags(banks["bank"], np.where(valid, fps, 0), now=now, max_age=age) & valid
    text_fps = np.where(valid, _text_hash(texts), 0)
    hidden = dup & ~rq.duplicate_flags(banks["seen"], text_fps, now=now, max_age=age)
    scores, trains = self.score(rq.ProposerInputs(texts, valid, agree, dup), r)
    trains = np.asarray(trains, bool) & keep
    labels = majority if r.labels == "majority" else [str(a) if v else None for a, v in
                                                       zip(analysis["answer"], valid)]
    trains &= np.array([label is not None for label in labels])
    solver_rewards = _reward([float(a is not None and a == labels[i // cfg.group_size])
                              for i, a in enumerate(extracted)])
    solved.valid = np.repeat(trains, cfg.group_size)

    rows = np.flatnonzero(solved.valid)                 # the solver's metrics: over the rows it learns from
    metrics.update(policy_metrics(take(solver_rewards, rows), host_rows(solved.rollout.lengths)[rows], cfg.group_size))
    new, learned, skipped, _ = self.solver.learn({k: v for k, v in state.items() if k not in ("proposer", "rquest")},
                                                 solved, solver_rewards, cfg.group_size, jax.random.fold_in(key, 4),
                                                 step)
    metrics.update(learned)
    prop_state, out = prop, [("proposer/", drafts, _reward(scores))]
    if r.judge_samples:
      out.append(("judge/", judged, judge_rewards))
    for i, (prefix, samples, rewards) in enumerate(out):
      section = self.sections[prefix]
      prop_state, learned, _, _ = self.learners[prefix].learn(prop_state, samples, rewards, section.group_size,
                                                              jax.random.fold_in(key, 5 + i), step)
      metrics.update({prefix + k: v for k, v in learned.items()})
    bank = rq.bank_add(banks["bank"], fps[valid], step)
    seen = rq.bank_add(banks["seen"], text_fps[valid], step)
    metrics.update(question_metrics(analysis, dup, hidden, agree, majority, trains, scores, bank))
    metrics["reward_failures"] = int(sum(failed.values()))
    return dict(new, proposer=prop_state, rquest={"bank": bank, "seen": seen}), metrics, skipped


SHOW = ("reward", "rquest/invalid", "rquest/duplicate")


def _run(ctx, cfg, state, start: int, meta: dict):
  executor = rl_stage.reward_executor(cfg)
  try:
    iteration = _Iteration(ctx, cfg, state, executor)
    return loop(ctx, cfg, state, start, meta, rl_stage.stage_iterator(ctx, cfg, meta), iteration, SHOW)
  finally:
    executor.close()


def validate(section, name: str) -> None:
  rl_stage.validate(section, name)
  r = section.rquest
  from rlkit.core.registry import choice
  from rlkit.train.phases.advantages import TOKEN_ESTIMATORS
  choice(r.reward, rq.PROPOSER_REWARDS, f"{name}.rquest.reward")
  if r.level not in checker.LEVELS or r.labels not in LABELS:
    raise ConfigError(f"{name}.rquest: level must be one of {list(checker.LEVELS)} and labels one of {list(LABELS)}; "
                      f"got level={r.level!r}, labels={r.labels!r}.")
  if section.augment != "none" or section.filter != "none" or section.advantage in TOKEN_ESTIMATORS:
    raise ConfigError(f"{name}: the rquest stage's groups are the proposer's questions and the solver's answers, with "
                      f"group advantages; set {name}.augment='none', {name}.filter='none' and a group advantage "
                      f"(got augment={section.augment!r}, filter={section.filter!r}, advantage={section.advantage!r}).")
  if r.group < 2 or r.max_new_tokens < 1 or r.bank_capacity < 1 or r.max_age < 0 or r.judge_samples < 0 \
      or r.judge_samples == 1 or not 0 <= r.tau_cons <= 1 or min(r.lam_dup, r.lam_inv, r.lam_rep) < 0 \
      or not 0 < r.rep_threshold <= 1 or not 0 <= r.max_value <= 2 ** 53:
    raise ConfigError(f"{name}.rquest needs group >= 2, max_new_tokens >= 1, bank_capacity >= 1, max_age >= 0, "
                      f"judge_samples 0 or >= 2, tau_cons in [0, 1], lam_dup, lam_inv, lam_rep >= 0, rep_threshold in "
                      f"(0, 1], max_value in [0, 2**53]; got {r.to_dict()}.")
  parts, questions = section.minibatches * section.micro_batches, section.prompts_per_step * r.group
  if questions % parts:
    raise ConfigError(f"{name}: the {questions} questions of an iteration (prompts_per_step x rquest.group) must divide "
                      f"into minibatches x micro_batches = {parts} equal parts.")


def trained_roles(section) -> tuple:
  return (section.rquest.proposer,)


register_stage("rquest", Stage(_init, _run, rquest_defaults, validate, roles=trained_roles))
