"""On-policy distillation in the trainer (the maths: `rlkit.objectives.distill`): one config section, `rl.distill`,
one token advantage estimator, and two scorers (registry SCORERS): `teacher` and, for a teacher with another
tokenizer, `xtok_teacher`.

  advantage `opd`        a_t = sg(log p_T(y_t) − log p_S(y_t)) + λ·A_t, with A the group estimator
                         `distill.reward_advantage` of the rewards (λ = `distill.reward_weight`; 0: pure OPD) on
                         every response token: OPD as RL with a per-token reward and discount 0, through the
                         clipped surrogate (the recipe of Thinking Machines' "On-Policy Distillation")
  loss terms             `opd` (sampled-token reverse KL, policy-gradient form), `reverse_kl`, `forward_kl`, `jsd`
                         (full distribution or the teacher's top-k), each weighted in `rl.loss_terms`
  scoring                the teacher (`distill.teacher`, a role of config.models) is scored by the `teacher` scorer
                         whenever one of them is on: its log-probs of the sampled tokens (extras
                         "<teacher>_logp") and, for the full-distribution terms, its distribution at the sampling
                         temperature ("<teacher>_dist_logp", with top-k also "<teacher>_dist_ids")
  cross tokenizer        a teacher with another tokenizer: `distill.cross_tokenizer` = aligned | spans | both
                         (rlkit/objectives/xtok.py, methods/llm.md §6; OUR DESIGN). The `xtok_teacher` scorer, a
                         host-side step after the policy's scoring, reads each row's prompt text and the ids the
                         student sampled, decodes them with their character offsets (`decode_with_offsets`: the
                         sampled ids, not a re-encoding), tokenizes prompt and response with the teacher's
                         tokenizer separately (so their junction is a boundary of both), scores the teacher's
                         response tokens (static power-of-two shapes), aligns the two tokenizations and stores
                         a_t = `xtok_opd_adv` in extras "<teacher>_xtok_adv", which the `opd` advantage reads
                         instead of the gap (λ·A_t is added as before); also "<teacher>_xtok_aligned" (strictly
                         aligned tokens) and "<teacher>_xtok_span" (span ids, -1 off spans), and the metrics
                         `distill/aligned_frac` (share of response tokens strictly aligned) and `distill/spans`
                         (mean spans per row). A row that ended with a stop token has it aligned with the
                         teacher's EOS after the text; special ids the student sampled mid-text carry no text and
                         join the span around them.
  aligned distributions  with a cross-tokenizer teacher the full-distribution terms (`reverse_kl`, `forward_kl`,
                         `jsd`) compare the two models at the strictly aligned positions only, over the shared
                         vocabulary (the token strings both vocabularies hold, `xtok.shared_vocab`; the student's
                         stop token paired with the teacher's EOS): `xtok_teacher` stores the teacher's log-probs at
                         the aligned teacher position restricted to the shared tokens ("<teacher>_dist_logp",
                         their ids in the student's vocabulary "<teacher>_dist_ids"; the k most likely of them with
                         `distill.top_k`), the term renormalises both sides on that support and logs the teacher's
                         kept mass (`distill/teacher_mass`: 1 − the mass renormalisation drops); unaligned
                         positions add nothing. The sampled-token term `opd` needs one vocabulary and is refused.

The `distill` stage kind (`rl_stage.distill_defaults`) is the rl stage with `advantage="opd"` by default, so
`stages = ("sft", "rl", "distill")` distils the RL policy into a student given as the run's model.
"""
from __future__ import annotations

import dataclasses
import functools
from typing import NamedTuple, Optional

import jax
import jax.numpy as jnp
import ml_collections
import numpy as np

from rlkit.core.errors import ConfigError
from rlkit.core.sections import RL_SECTIONS, Section
from rlkit.models.tokenizer import bucket_length, pad_left, pad_right
from rlkit.objectives import ADVANTAGES, group_advantages
from rlkit.objectives.distill import DIVERGENCES, opd_token_advantage
from rlkit.objectives.xtok import MODES, align_batch, shared_vocab, span_logp, teacher_at_student, xtok_opd_adv
from rlkit.parallel.hosts import host_rows, process_max, process_sum
from rlkit.rollout.scoring import make_distribution_scorer, make_scorer
from rlkit.train.phases.advantages import TOKEN_ESTIMATORS, TokenEstimator
from rlkit.train.phases.score import SCORERS, ScoreEnv, Scorer, ScorerSpec

SAMPLED = ("opd",)          # loss terms that read the teacher's log-probs of the sampled tokens


def distill_defaults() -> ml_collections.ConfigDict:
  c = ml_collections.ConfigDict()
  c.teacher = "teacher"         # the config.models role distilled from
  c.top_k = 0                   # full-distribution terms: the teacher's k most likely tokens per position (0: all)
  c.beta = 0.5                  # jsd: interpolation, 0 = forward KL, 1 = reverse KL (TRL GKD's convention)
  c.reward_weight = 0.0         # advantage opd: λ, the weight of the RL advantage added (0: pure distillation)
  c.reward_advantage = "group"  # advantage opd: the group estimator of that RL advantage
  c.cross_tokenizer = ""        # advantage opd with a teacher of another tokenizer: aligned | spans | both
                                # (rlkit/objectives/xtok.py; the divergence terms then compare aligned
                                # positions on the shared vocabulary); "": the teacher reads the student's ids
  return c


def uses_sampled(cfg) -> bool:
  return cfg.advantage == "opd" or any(t in cfg.loss_terms for t in SAMPLED)


def uses_distribution(cfg) -> bool:
  return any(t in cfg.loss_terms for t in DIVERGENCES)


def distill_roles(cfg) -> tuple:
  """The config.models roles the section's distillation scores: its teacher when anything reads it."""
  return (cfg.distill.teacher,) if uses_sampled(cfg) or uses_distribution(cfg) else ()


def _same_tokenizer(a, b) -> bool:
  return a is b or (a.vocab_size == b.vocab_size and a.get_vocab() == b.get_vocab())


def teacher_scorer(env: ScoreEnv) -> Optional[Scorer]:
  """The `teacher` scorer (registry SCORERS): the teacher's log-probs of the sampled tokens in
  extras["<teacher>_logp"] and its (top-k) distribution in extras["<teacher>_dist_logp"], ["<teacher>_dist_ids"],
  as the stage's terms and advantage read them; none with `cross_tokenizer` (the `xtok_teacher` scorer)."""
  ctx, cfg = env.ctx, env.cfg
  d = cfg.distill
  if not distill_roles(cfg) or d.cross_tokenizer:
    return None
  teacher, sampling = ctx.models[d.teacher], env.sampling
  if not _same_tokenizer(teacher.tokenizer, ctx.tokenizer):
    raise ConfigError(f"models.{d.teacher} has another tokenizer than the student ({teacher.tokenizer!r}, the "
                      f"student {ctx.tokenizer!r}), and distillation with distill.cross_tokenizer='' scores the "
                      "teacher on the student's token ids. For the opd advantage set the stage's "
                      f"distill.cross_tokenizer (e.g. rl.distill.cross_tokenizer='aligned'; one of "
                      f"{', '.join(MODES)}); the loss terms ({', '.join(SAMPLED + DIVERGENCES)}) need one tokenizer.")
  sampled = dist = None
  if uses_sampled(cfg) and d.teacher not in cfg.score_roles:      # a score role is scored by `roles` already
    sampled = make_scorer(teacher.module, sampling)
  if uses_distribution(cfg):
    if teacher.module.cfg.vocab_size != ctx.model.cfg.vocab_size:
      raise ConfigError(f"models.{d.teacher} has a vocabulary of {teacher.module.cfg.vocab_size}, the student "
                        f"{ctx.model.cfg.vocab_size}: the full-distribution terms ({', '.join(DIVERGENCES)}) compare "
                        "distributions over one vocabulary; use the `opd` term or advantage, or one tokenizer.")
    dist = make_distribution_scorer(teacher.module, cfg.temperature, d.top_k)

  def run(state, batch, samples):
    del state, samples
    extras = dict(batch.extras)
    if sampled is not None:
      extras[f"{d.teacher}_logp"] = sampled(teacher.params, batch)
    if dist is not None:                               # {"dist_logp", "dist_ids"} -> "<teacher>_dist_logp", ...
      extras.update({f"{d.teacher}_{k}": v for k, v in dist(teacher.params, batch).items()})
    return batch.replace(extras=extras), {}
  return Scorer(run)


class _TeacherRows(NamedTuple):
  """The rows under the teacher's tokenizer, with the fields `make_scorer` reads of a TrainBatch."""
  tokens: jax.Array           # [N, Pt + Rt] the prompt left-padded, then the response right-padded
  attention_mask: jax.Array   # [N, Pt + Rt]
  loss_mask: jax.Array        # [N, Rt] the response tokens

  @property
  def response_len(self) -> int:
    return self.loss_mask.shape[1]


@functools.partial(jax.jit, static_argnames="mode")
def _xtok_advantage(s_logp, t_logp, aligned, teacher_index, span_id, teacher_span_id, mode):
  """`xtok_opd_adv` [N, R] from both models' token log-probs ([N, R] student, [N, Rt] teacher) and the alignment.
  A span holds at least one student token, so R span slots always suffice."""
  n_spans = span_id.shape[1]
  return xtok_opd_adv(s_logp, teacher_at_student(t_logp, teacher_index), aligned, span_id,
                      span_logp(s_logp, span_id, n_spans), span_logp(t_logp, teacher_span_id, n_spans), mode)


@functools.partial(jax.jit, static_argnames="top_k")
def _aligned_distribution(t_dist_logp, teacher_index, aligned, s_ids, t_ids, top_k):
  """The teacher's log-probs [N, R, K] at each student position's aligned teacher position, on the shared
  tokens `t_ids` (not renormalised: their total is the kept mass), and their student ids [N, R, K]; with
  top_k the k most likely shared tokens. Zero rows at unaligned positions (the loss term leaves them out)."""
  logp = jnp.take(teacher_at_student(t_dist_logp, teacher_index), t_ids, axis=-1)
  ids = jnp.broadcast_to(s_ids, logp.shape)
  if top_k:
    logp, pick = jax.lax.top_k(logp, min(top_k, logp.shape[-1]))
    ids = jnp.take(s_ids, pick)
  return jnp.where(aligned[..., None], logp, 0.0), ids.astype(jnp.int32)


_logsumexp = jax.jit(functools.partial(jax.nn.logsumexp, axis=-1))


def _shared_ids(student_tok, teacher_tok) -> tuple[jax.Array, jax.Array]:
  """`shared_vocab` of the two tokenizers, with the student's EOS paired with the teacher's (the stop token is
  aligned with the teacher's EOS even when the two spell it differently)."""
  s_ids, t_ids = shared_vocab(student_tok.get_vocab(), teacher_tok.get_vocab())
  if student_tok.eos_id not in s_ids:
    s_ids, t_ids = np.append(s_ids, student_tok.eos_id), np.append(t_ids, teacher_tok.eos_id)
  return jnp.asarray(s_ids, jnp.int32), jnp.asarray(t_ids, jnp.int32)


def xtok_teacher_scorer(env: ScoreEnv) -> Optional[Scorer]:
  """The `xtok_teacher` scorer (registry SCORERS), with `distill.cross_tokenizer` set: the teacher scores its
  own tokenization of the rows' text, and the batch gets the cross-tokenizer advantage, the alignment and (for
  the divergence terms) the teacher's distribution at aligned positions (module docstring). It reads the
  policy's old log-probs, so it runs after the `policy` scorer."""
  ctx, cfg, sampling = env.ctx, env.cfg, env.sampling
  d = cfg.distill
  if not d.cross_tokenizer:
    return None
  teacher, student_tok = ctx.models[d.teacher], ctx.tokenizer
  t_tok, stops, key = teacher.tokenizer, set(student_tok.stop_ids), f"{d.teacher}_xtok"
  score_teacher = make_scorer(teacher.module, dataclasses.replace(sampling, stop_ids=t_tok.stop_ids,
                                                                  pad_id=t_tok.pad_id))
  bos = [] if t_tok.bos_id is None else [t_tok.bos_id]        # as the data pipeline prompts a model
  if uses_distribution(cfg):            # the full-distribution terms, at aligned positions (module docstring)
    score_dist = make_distribution_scorer(teacher.module, cfg.temperature, 0)
    shared = _shared_ids(student_tok, t_tok)            # (student ids, teacher ids) of the shared strings

  def run(state, batch, samples):
    del state
    ro, valid = samples.rollout, samples.valid
    response, lengths = host_rows(ro.response), np.where(valid, host_rows(ro.lengths), 0)
    prompts, responses, pairs, stop = [], [], [], np.zeros(len(samples), bool)
    for i, example in enumerate(samples.examples):
      ids = response[i, :lengths[i]].tolist()
      ends = int(bool(ids) and ids[-1] in stops)                  # 1: the row's last id is a stop token
      stop[i] = ends
      text, offsets = student_tok.decode_with_offsets(ids[:len(ids) - ends])
      t_ids, t_offsets = t_tok.encode_with_offsets(text)
      prompts.append(bos + t_tok.encode(example["prompt"]))
      responses.append(t_ids + [t_tok.eos_id] * ends)
      pairs.append((offsets, t_offsets))
    # Widths every process shares (put_batch needs one shape), in power-of-two buckets: few compiles.
    p_len, r_len = (int(w) for w in process_max([bucket_length(max(map(len, rows), default=1))
                                                 for rows in (prompts, responses)]))
    r = batch.response_len
    al = align_batch(pairs, student_len=r, teacher_len=r_len, max_spans=r)
    rows = np.flatnonzero(stop)
    al.aligned[rows, lengths[rows] - 1] = True                  # the stop token <-> the teacher's EOS
    al.teacher_index[rows, lengths[rows] - 1] = [len(responses[i]) - 1 for i in rows]
    prompt, prompt_mask = pad_left(prompts, p_len, t_tok.pad_id)
    resp, resp_mask = pad_right(responses, r_len, t_tok.pad_id)
    dev = ctx.put_batch({"tokens": np.concatenate([prompt, resp], 1),
                         "mask": np.concatenate([prompt_mask, resp_mask], 1), "response_mask": resp_mask,
                         "aligned": al.aligned, "teacher_index": al.teacher_index, "span_id": al.span_id,
                         "teacher_span_id": al.teacher_span_id})
    t_logp = score_teacher(teacher.params, _TeacherRows(dev["tokens"], dev["mask"], dev["response_mask"]))
    adv = _xtok_advantage(batch.old_logp, t_logp, dev["aligned"], dev["teacher_index"], dev["span_id"],
                          dev["teacher_span_id"], mode=d.cross_tokenizer)
    tokens, aligned, spans, n_rows = process_sum([lengths.sum(), al.aligned.sum(), al.n_spans[valid].sum(),
                                                  valid.sum()])
    extras = {f"{key}_adv": adv, f"{key}_aligned": dev["aligned"], f"{key}_span": dev["span_id"]}
    metrics = {"distill/aligned_frac": float(aligned / max(tokens, 1)),
               "distill/spans": float(spans / max(n_rows, 1))}
    if uses_distribution(cfg):
      t_dist = score_dist(teacher.params, _TeacherRows(dev["tokens"], dev["mask"], dev["response_mask"]))
      dist_logp, extras[f"{d.teacher}_dist_ids"] = _aligned_distribution(
          t_dist["dist_logp"], dev["teacher_index"], dev["aligned"], *shared, top_k=d.top_k)
      extras[f"{d.teacher}_dist_logp"] = dist_logp
      mass = process_sum([np.where(host_rows(dev["aligned"]), np.exp(host_rows(_logsumexp(dist_logp))), 0).sum()])
      metrics["distill/teacher_mass"] = float(mass[0] / max(aligned, 1))
    return batch.replace(extras=dict(batch.extras, **extras)), metrics
  return Scorer(run)


def _problem(cfg, name: str) -> str:
  """'' if the section's distill settings are in range, else the message."""
  d = cfg.distill
  if not 0.0 <= d.beta <= 1.0 or d.top_k < 0 or d.reward_weight < 0:
    return (f"{name}.distill needs beta in [0, 1], top_k >= 0 and reward_weight >= 0; got beta={d.beta}, "
            f"top_k={d.top_k}, reward_weight={d.reward_weight}.")
  if d.reward_advantage not in ADVANTAGES:
    return f"{name}.distill.reward_advantage={d.reward_advantage!r}: one of {', '.join(ADVANTAGES)}."
  if d.cross_tokenizer:
    where = f"{name}.distill.cross_tokenizer={d.cross_tokenizer!r}"
    if d.cross_tokenizer not in MODES:
      return f"{where}: '' (the teacher shares the student's tokenizer) or one of {', '.join(MODES)}."
    one_vocab = sorted(t for t in cfg.loss_terms.keys() if t in SAMPLED)
    if one_vocab:
      return (f"{where} with {name}.loss_terms {one_vocab}: that term reads the teacher's log-prob of each "
              "sampled student token, over one vocabulary, which a teacher with another tokenizer does not "
              f"share; drop it (the cross-tokenizer signal is the advantage, {name}.advantage='opd', and the "
              f"full-distribution terms {', '.join(DIVERGENCES)} at aligned positions), or set "
              "cross_tokenizer='' for a teacher with the student's tokenizer.")
    if cfg.advantage != "opd":
      return (f"{where} is read by the opd advantage only, and {name}.advantage={cfg.advantage!r}; set "
              f"{name}.advantage='opd', or cross_tokenizer=''.")
  return ""


def _opd(rewards, batch, cfg, capacity, valid):
  d, mask = cfg.distill, batch.loss_mask
  if d.cross_tokenizer:      # `after_score`'s advantage through the alignment
    adv = jnp.where(mask, batch.extras[f"{d.teacher}_xtok_adv"], 0.0)
  else:
    adv = opd_token_advantage(batch.old_logp, batch.extras[f"{d.teacher}_logp"], mask)
  if d.reward_weight:
    group = group_advantages(d.reward_advantage, rewards.rewards, capacity, cfg.adv_eps, valid)
    adv = adv + d.reward_weight * jnp.where(mask, group[:, None], 0.0)
  return adv, {}


TOKEN_ESTIMATORS.add("opd", TokenEstimator(_opd, needs_values=False))


def check(stage, name: str) -> None:
  problem = _problem(stage, name)
  if problem:
    raise ValueError(problem)


def _roles(stage, name: str) -> list[tuple[str, str]]:
  return [(role, f"{name}.distill.teacher={role!r}: the stage distils from that model ({name}.advantage="
                 f"{stage.advantage!r}, loss terms {list(stage.loss_terms.keys())})")
          for role in distill_roles(stage)]


RL_SECTIONS.add("distill", Section(distill_defaults, check, _roles,
                                   doc="on-policy distillation from a teacher role (advantage opd, loss terms "
                                       "opd, reverse_kl, forward_kl, jsd; rlkit/train/distill.py)"))
SCORERS.add("teacher", ScorerSpec(teacher_scorer, order=30))
SCORERS.add("xtok_teacher", ScorerSpec(xtok_teacher_scorer, order=40))
