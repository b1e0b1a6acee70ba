"""Cross-tokenizer on-policy distillation on the rl stage (`rl.distill.cross_tokenizer`), in-process: a teacher
with the student's own tokenizer, read through the alignment, gives the same-tokenizer OPD advantages; a teacher
with a byte-level BPE (and its own model) gives, in each mode, the advantage computed here by hand from its own
tokenization of the text the student's rows hold; the configurations that need one vocabulary are refused.

The student is the char model of test_stages, so every student token is one character: a teacher token of one
character is strictly aligned with the student's token there, and a longer one is exactly one mismatch span
(the student's characters under it). The demonstration augmenter adds a row per group with the answer and EOS
("12" + EOS), which the BPE writes as one token: spans, and a stop token to align with the teacher's EOS.
"""
import contextlib
import functools
from unittest import mock

import jax
import ml_collections
import numpy as np
import pytest

from rlkit.models.bpe import bpe_tokenizer
from rlkit.models.tokenizer import pad_left, pad_right
from rlkit.models.transformer import Transformer, init_params
from rlkit.rollout.scoring import response_forward, score_response
from rlkit.train import distill, rl_stage
from rlkit.core.errors import ConfigError
from rlkit.train.rl_config import rl_defaults
from rlkit.train.phases.collect import sampling_config
from rlkit.train.models import Model
from tests.fast_compile import fast_compile
import test_stages as ts

DEMO = {"advantage": "opd", "augment": "demonstration"}
CORPUS = [f"{a}+{b}={a + b}" for a in range(100) for b in range(0, 100, 7)]


@functools.lru_cache(maxsize=1)
def _bpe_teacher() -> Model:
  """A byte-level BPE of arithmetic strings (merges inside numbers: "12", "35") and a model of its vocabulary."""
  tok = bpe_tokenizer(CORPUS, 300)
  module = Transformer(ts.MODEL.cfg.replace(vocab_size=tok.vocab_size))
  with fast_compile():
    params = init_params(module.cfg, jax.random.key(7))
  return Model(module, params, tok, False)


def _same_teacher() -> Model:
  return ts._roles()["teacher"]


@contextlib.contextmanager
def _teacher(model: Model):
  with mock.patch.object(ts, "_roles", lambda: {"teacher": model}):
    yield


_RUNS: dict = {}


def _run(mode: str, teacher: str) -> ts.Run:
  """One iteration of DEMO with `cross_tokenizer=mode` and the "same" or the "bpe" teacher (memoised; the
  teacher's scorer is shared between runs like the stage's)."""
  if (mode, teacher) not in _RUNS:
    model = _bpe_teacher() if teacher == "bpe" else _same_teacher()
    with _teacher(model):
      _RUNS[mode, teacher] = ts.run_stage({**DEMO, "distill.cross_tokenizer": mode},
                                          patches=[(distill, "make_scorer", ts._memo_scorer)])
  return _RUNS[mode, teacher]


def _host(run):
  b = run.batches[0]
  return {k: np.asarray(v) for k, v in (("adv", b.advantages), ("mask", b.loss_mask), ("tokens", b.tokens),
                                         ("old", b.old_logp), ("aligned", b.extras["teacher_xtok_aligned"]),
                                         ("span", b.extras["teacher_xtok_span"]))}


def test_a_teacher_with_the_students_tokenizer_gives_the_same_tokenizer_opd():
  """Every position aligned (the stop tokens with the teacher's EOS), no span: the advantages are the
  same-tokenizer gap, to float rounding (the teacher's rows are padded to other widths)."""
  same, cross = ts.one_iteration(**DEMO), _run("aligned", "same")
  c = _host(cross)
  np.testing.assert_array_equal(c["tokens"], np.asarray(same.batches[0].tokens))
  np.testing.assert_array_equal(c["aligned"], c["mask"])
  assert (c["span"] == -1).all()
  assert cross.metrics["distill/aligned_frac"] == 1.0 and cross.metrics["distill/spans"] == 0.0
  response = c["tokens"][:, -ts.MAX_NEW:]
  assert (response[c["mask"]] == ts.TOK.eos_id).sum() >= ts.PROMPTS           # stop tokens, aligned too
  np.testing.assert_allclose(c["adv"], np.asarray(same.batches[0].advantages), atol=1e-6)
  assert np.abs(c["adv"][c["mask"]]).min() > 0


def _teacher_rows(h):
  """The BPE teacher's own tokenization of each row's prompt and response text, unbucketed (exact widths):
  (tokens, attention mask, response width, each row's response offsets, whether it ended with a stop)."""
  tok, r = _bpe_teacher().tokenizer, ts.MAX_NEW
  prompts, responses, offsets, stops = [], [], [], []
  for tokens, mask in zip(h["tokens"], h["mask"]):
    ids = tokens[-r:][mask].tolist()
    stop = bool(ids) and ids[-1] == ts.TOK.eos_id
    text = ts.TOK.decode(ids[:len(ids) - stop])
    assert len(text) == len(ids) - stop, "a special id mid-text: the rule below does not cover it"
    t_ids, t_off = tok.encode_with_offsets(text)
    prompts.append([tok.bos_id] + tok.encode(ts.TOK.decode(tokens[:-r].tolist())))
    responses.append(t_ids + [tok.eos_id] * stop)
    offsets.append(t_off)
    stops.append(stop)
  p, rt = max(map(len, prompts)), max(map(len, responses))
  pt, pm = pad_left(prompts, p, tok.pad_id)
  rtok, rm = pad_right(responses, rt, tok.pad_id)
  return np.concatenate([pt, rtok], 1), np.concatenate([pm, rm], 1), rt, offsets, stops


def _by_hand(run, mode: str) -> np.ndarray:
  """The advantage of `mode` from the BPE teacher's own tokenization (`_teacher_rows`), aligned by the
  char-student rule of the module docstring."""
  h, teacher = _host(run), _bpe_teacher()
  tokens, mask, rt, offsets, stops = _teacher_rows(h)
  sampling = sampling_config(ts._config({}), ts.TOK)
  with fast_compile():
    t_logp = np.asarray(jax.jit(score_response, static_argnums=(0, 4, 5))(
        teacher.module, teacher.params, tokens, mask, rt, sampling))
  aligned, spans = np.zeros_like(h["old"]), np.zeros_like(h["old"])
  for i, (t_off, stop) in enumerate(zip(offsets, stops)):
    s_logp = h["old"][i]
    for j, (s, e) in enumerate(t_off):
      if e - s == 1:
        aligned[i, s] = t_logp[i, j] - s_logp[s]
      else:
        spans[i, s:e] = t_logp[i, j] - s_logp[s:e].sum()
    if stop:
      n = h["mask"][i].sum()
      aligned[i, n - 1] = t_logp[i, len(t_off)] - s_logp[n - 1]
  return {"aligned": aligned, "spans": spans, "both": aligned + spans}[mode]


@pytest.mark.parametrize("mode", ["aligned", "spans", "both"])
def test_b_a_teacher_with_another_tokenizer_supervises_through_the_alignment(mode):
  run = _run(mode, "bpe")
  h = _host(run)
  frac = run.metrics["distill/aligned_frac"]
  assert 0 < frac < 1 and run.metrics["distill/spans"] > 0
  np.testing.assert_allclose(frac, (h["aligned"] & h["mask"]).sum() / h["mask"].sum(), rtol=1e-6)
  assert not (h["aligned"] & (h["span"] >= 0)).any() and ((h["span"] >= 0) | h["aligned"])[h["mask"]].all()
  np.testing.assert_allclose(h["adv"], _by_hand(run, mode), atol=1e-5)
  on_span, on_aligned = h["span"] >= 0, h["aligned"]
  if mode == "spans":
    assert (h["adv"][on_aligned] == 0).all()
    for i, k in zip(*np.nonzero(on_span)):                      # one number per span
      np.testing.assert_allclose(h["adv"][i][h["span"][i] == h["span"][i, k]], h["adv"][i, k], rtol=0, atol=0)
  if mode == "aligned":
    assert (h["adv"][on_span] == 0).all()
  if mode == "both":
    parts = [_host(_run(m, "bpe")) for m in ("aligned", "spans")]
    np.testing.assert_array_equal(h["tokens"], parts[0]["tokens"])          # the same samples in every mode
    np.testing.assert_allclose(h["adv"], parts[0]["adv"] + parts[1]["adv"], atol=1e-6)
  assert np.abs(run.delta).max() > 0


def test_c_configurations_that_need_one_vocabulary_are_refused():
  section = rl_defaults()
  section.advantage, section.distill.cross_tokenizer = "opd", "bogus"
  with pytest.raises(ConfigError, match="cross_tokenizer='bogus'.*aligned, spans, both"):
    rl_stage.validate(section, "rl")
  section.distill.cross_tokenizer = "spans"
  rl_stage.validate(section, "rl")
  section.loss_terms = ml_collections.ConfigDict({"opd": 1.0})
  with pytest.raises(ConfigError, match=r"loss_terms \['opd'\].*one vocabulary"):
    rl_stage.validate(section, "rl")
  for term in ("reverse_kl", "forward_kl", "jsd"):          # these compare aligned positions (test_d)
    section.loss_terms = ml_collections.ConfigDict({term: 1.0})
    rl_stage.validate(section, "rl")
  section.loss_terms, section.advantage = ml_collections.ConfigDict({}), "group"
  with pytest.raises(ConfigError, match="read by the opd advantage only"):
    rl_stage.validate(section, "rl")
  # The same-tokenizer path with a teacher of another tokenizer: refused as the stage builds, naming the fix.
  with _teacher(_bpe_teacher()):
    for overrides in ({"advantage": "opd"}, {"loss_terms": {"reverse_kl": 1.0}}):
      with pytest.raises(ConfigError, match=r"another tokenizer.*rl\.distill\.cross_tokenizer='aligned'"):
        ts.run_stage(overrides)


def test_d_the_divergence_terms_compare_aligned_positions_on_the_shared_vocabulary():
  """With the BPE teacher, `reverse_kl` reads at each strictly aligned student position the teacher's
  distribution at its own aligned token (computed here from its tokenization of the text), restricted to the
  strings both vocabularies hold (the characters and EOS), and nothing at the other positions; the teacher's
  kept mass is below one (its multi-character tokens are dropped) and the term moves the update."""
  with _teacher(_bpe_teacher()):
    run = ts.run_stage({**DEMO, "distill.cross_tokenizer": "aligned", "loss_terms": {"reverse_kl": 1.0}},
                       patches=[(distill, "make_scorer", ts._memo_scorer)])
  h, teacher, extras = _host(run), _bpe_teacher(), run.batches[0].extras
  s_ids, t_ids = (np.asarray(a) for a in distill._shared_ids(ts.TOK, teacher.tokenizer))
  logp, ids = np.asarray(extras["teacher_dist_logp"]), np.asarray(extras["teacher_dist_ids"])
  np.testing.assert_array_equal(ids, np.broadcast_to(s_ids, ids.shape))
  assert (logp[~h["aligned"]] == 0).all()
  tokens, mask, rt, offsets, stops = _teacher_rows(h)
  with fast_compile():
    logits, _ = jax.jit(response_forward, static_argnums=(0, 4))(teacher.module, teacher.params, tokens, mask, rt)
  full = np.asarray(jax.nn.log_softmax(logits.astype(np.float32) / ts._config({}).temperature, axis=-1))
  checked = 0
  for i, (t_off, stop) in enumerate(zip(offsets, stops)):
    pairs = [(s, j) for j, (s, e) in enumerate(t_off) if e - s == 1]
    pairs += [(h["mask"][i].sum() - 1, len(t_off))] * stop        # the stop token and the teacher's EOS
    for s, j in pairs:
      np.testing.assert_allclose(logp[i, s], full[i, j][t_ids], atol=1e-5)
    checked += len(pairs)
  assert checked == h["aligned"].sum() > 0
  assert 0 < run.metrics["distill/teacher_mass"] < 1 and run.metrics["distill/reverse_kl"] > 0
  assert not np.allclose(run.delta, _run("aligned", "bpe").delta)
