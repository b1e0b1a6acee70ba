"""Self-Retrospection Distillation on the RL stage (OUR DESIGN, methods/llm.md §4; the maths and the loss terms
`srd`, `srd_jsd`: `rlkit.objectives.srd`): the config section `rl.srd` and the `hindsight` scorer.

The scorer (registry SCORERS, run after the advantages: its row weights read them) is built when a loss term
`srd` or `srd_jsd` has a weight > 0 in `rl.loss_terms` (or a schedule `rl.schedules["weight/<term>"]`). For
each row it builds the retrospective teacher's input host-side,

  [ left padding | the row's prompt tokens | encode(template.format(hindsight=TEXT)) | the row's response ]

the prompt and the hindsight block left-padded together as a new prompt (power-of-two width,
`bucket_length`), the response columns unchanged, so the teacher's log-probs of the last R columns line up
with the student's token for token (the response's observations stay attended, as the student saw them).
It scores them with the current policy (`state["train"].params`, the program that scores old_logp; outside
the differentiated step, so stop-gradient) and writes to the batch's extras

  hindsight_logp        [N, R]     the teacher's log-probs of the sampled tokens (srd)
  hindsight_dist_logp   [N, R, k]  the teacher's top-k distribution at each response position (srd_jsd)
  hindsight_dist_ids    [N, R, k]
  srd_weight            [N]        weight_hi on rows of zero-variance groups (every |A| <= zero_tol on the
                                   group's loss tokens), weight_lo elsewhere

and logs srd/zero_variance_frac (share of real rows in zero-variance groups), srd/gap (mean teacher − student
log-prob over loss tokens) and srd/hindsight_tokens (mean hindsight block length per real row).

TEXT, by `rl.srd.hindsight`:
  episode   what the completed episode and the gold answer tell: "The way was: <W>. Answer: <A>", W the row's
            fields["episode"][srd.field] (the multi-turn collector's episode summary; key_door's "solution"
            is the shortest way), A the example's answer; either part is left out where absent or empty,
            and the answer where it repeats W (key_door's answer is its shortest way). A row with neither
            gets no block.
  shuffled  the control: row j of group g gets the TEXT of row j of group (g+1) mod n_groups (a fixed
            derangement of this process's groups), so the block carries hindsight of another task.
  empty     no block: the teacher reads exactly the student's context, and the SRD signal is zero (up to
            the numerics of another padding width).

With `rl.replay_routing` (MoE) the teacher is scored without the replay: the routing was recorded on the
student's context, which the hindsight block shifts.
"""
from __future__ import annotations

from typing import Any, Mapping, Optional, Sequence

import jax.numpy as jnp
import ml_collections
import numpy as np

from rlkit.core.sections import RL_SECTIONS, Section
from rlkit.models.tokenizer import bucket_length, pad_left
from rlkit.objectives.srd import (ROW_WEIGHT, TEACHER_DIST_IDS, TEACHER_DIST_LOGP, TEACHER_LOGP, TERMS,
                                  row_weights, zero_variance_rows)
from rlkit.parallel.hosts import host_rows, process_max, process_sum
from rlkit.rollout.scoring import make_distribution_scorer, make_scorer
from rlkit.train.phases.score import SCORERS, ScoreEnv, Scorer, ScorerSpec

MODES = ("episode", "shuffled", "empty")


def srd_defaults() -> ml_collections.ConfigDict:
  c = ml_collections.ConfigDict()
  c.hindsight = "episode"       # loss terms srd/srd_jsd: the teacher's hindsight: episode (the row's episode
                                # field and the gold answer) | shuffled (another group's: the control) | empty
                                # (no block: the teacher is the student, zero signal)
  c.field = "solution"          # hindsight=episode: the key of the row's fields["episode"] shown (key_door: the
                                # shortest way)
  c.template = "<hindsight>{hindsight}</hindsight>\n"   # the block inserted between prompt and response
  c.weight_hi = 1.0             # the terms' row weight in zero-variance groups (no advantage signal)
  c.weight_lo = 0.1             # the terms' row weight in every other group
  c.zero_tol = 1e-6             # a group is zero-variance when every |advantage| on its loss tokens is <= this
  c.top_k = 16                  # srd_jsd: the teacher's k most likely tokens per position (the JSD's support)
  c.beta = 0.5                  # srd_jsd: JSD interpolation, 0 = forward KL, 1 = reverse KL (as distill.beta)
  return c


def active_terms(cfg) -> tuple[str, ...]:
  """The SRD loss terms the section trains with: weight > 0, or a weight schedule."""
  terms = dict(cfg.loss_terms)
  return tuple(t for t in TERMS if t in terms and (terms[t] > 0 or f"weight/{t}" in cfg.schedules))


# ------------------------------------------------------------------------------------ the teacher's input

def episode_text(example: Mapping[str, Any], field: str) -> str:
  """hindsight=episode's TEXT of one row (module docstring); "" when the row has nothing to show."""
  episode = (example.get("fields") or {}).get("episode") or {}
  way = episode.get(field) if isinstance(episode, Mapping) else None
  way = "" if way is None else str(way)
  answer = str(example.get("answer") or "")
  parts = ([f"The way was: {way}"] if way else []) + ([f"Answer: {answer}"] if answer and answer != way else [])
  return ". ".join(parts)


def group_capacity(group_ids: np.ndarray) -> int:
  """Rows per group of a batch laid out group by group (each group's rows contiguous, all groups equal)."""
  n = len(group_ids)
  starts = np.flatnonzero(np.r_[True, group_ids[1:] != group_ids[:-1]]) if n else np.zeros(1, int)
  sizes = np.diff(np.r_[starts, n])
  if not n or len(set(sizes.tolist())) != 1 or len(np.unique(group_ids)) != len(starts):
    raise ValueError(f"srd: the batch's {n} rows are not groups of equal size laid out contiguously (group ids "
                     f"{group_ids.tolist()[:16]}...); the zero-variance weights need the stage's group layout.")
  return int(sizes[0])


def hindsight_texts(examples: Sequence[Mapping[str, Any]], mode: str, field: str, capacity: int) -> list[str]:
  """Each row's TEXT under `mode` (module docstring); rows are groups of `capacity` in order."""
  if mode == "empty":
    return [""] * len(examples)
  own = [episode_text(ex, field) for ex in examples]
  if mode == "episode":
    return own
  n_groups = len(own) // capacity
  return [own[((i // capacity + 1) % n_groups) * capacity + i % capacity] for i in range(len(own))]


def teacher_prompts(prompts: np.ndarray, prompt_mask: np.ndarray, texts: Sequence[str], template: str,
                    tokenizer) -> tuple[list[list[int]], list[int]]:
  """(each row's prompt ids followed by its hindsight block's, each block's length); no block for TEXT ""."""
  blocks = [tokenizer.encode(template.format(hindsight=t)) if t else [] for t in texts]
  rows = [prompts[i][prompt_mask[i]].tolist() + blocks[i] for i in range(len(texts))]
  return rows, [len(b) for b in blocks]


# ------------------------------------------------------------------------------------------- the scorer

def hindsight_scorer(env: ScoreEnv) -> Optional[Scorer]:
  """The `hindsight` scorer (registry SCORERS, module docstring), or None when no SRD term is on."""
  ctx, cfg = env.ctx, env.cfg
  terms = active_terms(cfg)
  if not terms:
    return None
  s, tok = cfg.srd, ctx.tokenizer
  logp_fn = env.policy_logp if not cfg.replay_routing else make_scorer(env.model, env.sampling)
  dist_fn = None
  if "srd_jsd" in terms:
    dist_fn = make_distribution_scorer(env.model, cfg.temperature, min(int(s.top_k), env.model.cfg.vocab_size))

  def run(state, batch, samples):
    ro, valid = samples.rollout, np.asarray(samples.valid, bool)
    capacity = group_capacity(host_rows(batch.group_ids))
    texts = hindsight_texts(samples.examples, s.hindsight, s.field, capacity)
    rows, block_len = teacher_prompts(host_rows(ro.prompt), host_rows(ro.prompt_mask).astype(bool), texts,
                                      s.template, tok)
    width = int(process_max([bucket_length(max(map(len, rows), default=1))])[0])
    prompt, prompt_mask = pad_left(rows, width, tok.pad_id)
    dev = ctx.put_batch({"prompt": prompt, "mask": prompt_mask & valid[:, None]})
    r = batch.response_len
    teacher = batch.replace(  # the response columns as they are: the teacher's log-probs align with the student's
        tokens=jnp.concatenate([jnp.asarray(dev["prompt"]), batch.tokens[:, -r:]], 1),
        attention_mask=jnp.concatenate([jnp.asarray(dev["mask"]), batch.attention_mask[:, -r:]], 1), extras={})
    params = state["train"].params
    extras = {TEACHER_LOGP: logp_fn(params, teacher)}
    if dist_fn is not None:
      dist = dist_fn(params, teacher)
      extras[TEACHER_DIST_LOGP], extras[TEACHER_DIST_IDS] = dist["dist_logp"], dist["dist_ids"]
    zero_var = zero_variance_rows(batch.advantages, batch.loss_mask, capacity, float(s.zero_tol))
    extras[ROW_WEIGHT] = row_weights(zero_var, float(s.weight_hi), float(s.weight_lo))
    mask = host_rows(batch.loss_mask)
    gap = np.where(mask, host_rows(extras[TEACHER_LOGP]) - host_rows(batch.old_logp), 0.0)
    n_rows, n_zero, blocks, tokens, gap_sum = process_sum([
        valid.sum(), host_rows(zero_var)[valid].sum(), np.asarray(block_len)[valid].sum(), mask.sum(), gap.sum()])
    metrics = {"srd/zero_variance_frac": float(n_zero / max(n_rows, 1)),
               "srd/gap": float(gap_sum / max(tokens, 1)),
               "srd/hindsight_tokens": float(blocks / max(n_rows, 1))}
    return batch.replace(extras=dict(batch.extras, **extras)), metrics
  return Scorer(run)


# ------------------------------------------------------------------------------------------- the checks

def check(stage, name: str) -> None:
  s, where = stage.srd, f"{name}.srd"
  if s.hindsight not in MODES:
    raise ValueError(f"{where}.hindsight={s.hindsight!r}: choose one of {', '.join(MODES)}.")
  if not isinstance(s.field, str) or not s.field:
    raise ValueError(f"{where}.field={s.field!r} must name a key of the episode summary (key_door: 'solution').")
  if "{hindsight}" not in s.template:
    raise ValueError(f"{where}.template={s.template!r} has no '{{hindsight}}' placeholder; put it where the "
                     "hindsight text goes, e.g. '<hindsight>{hindsight}</hindsight>\\n'.")
  try:
    s.template.format(hindsight="")
  except (KeyError, IndexError, ValueError) as e:
    raise ValueError(f"{where}.template={s.template!r} is not a format string with the one field "
                     f"'{{hindsight}}' ({type(e).__name__}: {e}); write a literal brace as '{{{{' or "
                     "'}}'.") from None
  for key in ("weight_hi", "weight_lo", "zero_tol"):
    if s[key] < 0:
      raise ValueError(f"{where}.{key}={s[key]!r} must be >= 0.")
  if s.top_k < 1:
    raise ValueError(f"{where}.top_k={s.top_k!r} must be >= 1 (the teacher's tokens per position srd_jsd "
                     "compares on).")
  if not 0.0 <= s.beta <= 1.0:
    raise ValueError(f"{where}.beta={s.beta!r} must be in [0, 1] (0: forward KL, 1: reverse KL).")
  if s.hindsight == "shuffled" and active_terms(stage) and stage.prompts_per_step < 2:
    raise ValueError(f"{where}.hindsight='shuffled' gives each group another group's hindsight, and "
                     f"{name}.prompts_per_step={stage.prompts_per_step} makes one group; set prompts_per_step >= 2.")


RL_SECTIONS.add("srd", Section(srd_defaults, check,
                               doc="Self-Retrospection Distillation: the hindsight teacher of the loss terms srd, "
                                   "srd_jsd (rlkit/train/srd.py)"))
SCORERS.add("hindsight", ScorerSpec(hindsight_scorer, order=70, when="advantages"))
