"""Engine-mismatch simulator: off = plain sampling bit for bit, deterministic noise, a gap to the trainer that
grows with the noise, tail noise concentrated on low-probability tokens, a small bf16 gap, clear errors.

The model is a tiny random one whose LM head is scaled 30x: at random init the logits are ~0.1 and every
next-token distribution is near-uniform; scaled, they range from near-uniform to near-deterministic (about
10-20% of the sampled tokens have p > 0.9 and half have p < 0.3), so both probability buckets are populated.
Rollouts compile with XLA's optimisations off (`fast_compile`): the model's width is used by no other test
module, so no jitted function is shared with them.
"""
from __future__ import annotations

import jax
import jax.numpy as jnp
import ml_collections
import numpy as np
import pytest

from rlkit.models.transformer import Transformer, TransformerConfig, init_params
from rlkit.rollout.mismatch import (LogitNoise, Mismatch, from_config, generate_with_mismatch, mismatch_defaults,
                                    sampling_model)
from rlkit.rollout.sampler import SamplingConfig, generate, processed_logprobs
from rlkit.rollout.scoring import response_logprobs
from rlkit.train.config_docs import field_comments
from tests.fast_compile import fast_compile

CFG = TransformerConfig(vocab_size=80, hidden_size=32, intermediate_size=40, num_layers=2, num_heads=4,
                        num_kv_heads=2, head_dim=8, rope_theta=10_000.0)
MODEL = Transformer(CFG)
SAMPLING = SamplingConfig(max_new_tokens=16)
B, P = 64, 4
FIELDS = ("response", "response_mask", "logprobs", "lengths", "finished", "group_ids")


@pytest.fixture(scope="module")
def setup():
  params = init_params(CFG, jax.random.key(0))
  params = dict(params, lm_head=params["lm_head"] * 30.0)
  prompt = jax.random.randint(jax.random.key(1), (B, P), 1, CFG.vocab_size)
  return params, prompt, jnp.ones((B, P), bool)


@pytest.fixture(scope="module")
def sample(setup):
  """`sample(mismatch, key=2) -> (rollout, trainer log-probs, |Δ log p|)`, each mismatch compiled once. The
  trainer scores with the unperturbed float32 model under the same SamplingConfig."""
  params, prompt, mask = setup
  score = jax.jit(lambda prm, out: response_logprobs(MODEL, prm, out, SAMPLING))
  memo = {}

  def get(mismatch: Mismatch, key: int = 2):
    if (mismatch, key) not in memo:
      with fast_compile():
        out = generate_with_mismatch(MODEL, params, prompt, mask, jax.random.key(key), SAMPLING, mismatch)
        trainer = np.asarray(score(params, out))
      valid = np.asarray(out.response_mask)
      memo[mismatch, key] = out, trainer[valid], np.abs(np.asarray(out.logprobs) - trainer)[valid]
    return memo[mismatch, key]
  return get


def _assert_same(a, b):
  for f in FIELDS:
    np.testing.assert_array_equal(getattr(a, f), getattr(b, f), err_msg=f)


def test_inactive_mismatch_is_plain_generate_bit_for_bit(setup, sample):
  params, prompt, mask = setup
  with fast_compile():
    plain = generate(MODEL, params, prompt, mask, jax.random.key(2), SAMPLING)
    # The hook's code path with zero noise: the uniforms (and everything else) must be those of a plain run.
    zero = generate(MODEL, params, prompt, mask, jax.random.key(2), SAMPLING, perturb=LogitNoise(0.0, "tail"))
  assert not Mismatch().active and not Mismatch(noise_kind="tail").active
  for m in (Mismatch(), Mismatch(noise_kind="tail"), Mismatch(dtype="float32")):
    _assert_same(sample(m)[0], plain)
  _assert_same(zero, plain)
  assert Mismatch().logits_hook(SAMPLING) is None and sampling_model(MODEL, Mismatch(dtype="float32")) is MODEL


def test_noise_is_a_function_of_the_sampling_key(setup, sample):
  params, prompt, mask = setup
  m = Mismatch(noise_scale=0.3)
  out, _, delta = sample(m)
  with fast_compile():
    again = generate_with_mismatch(MODEL, params, prompt, mask, jax.random.key(2), SAMPLING, m)
  _assert_same(again, out)
  other = sample(m, key=3)[0]
  assert np.mean(np.asarray(other.response) != np.asarray(out.response)) > 0.5
  # The noise stream differs per key and per step, and is not the key's own stream.
  hook, x = m.logits_hook(SAMPLING), jnp.zeros((2, CFG.vocab_size))
  k = jax.random.key(2)
  draws = [hook(x, jax.random.fold_in(k, 0)), hook(x, jax.random.fold_in(k, 1)), hook(x, jax.random.key(3))]
  for i in range(3):
    for j in range(i):
      assert not np.allclose(draws[i], draws[j])
  # Same key with and without a little noise: the same uniforms, so most rows' first tokens agree, while
  # the behaviour log-probs all move.
  plain, small = sample(Mismatch())[0], sample(Mismatch(noise_scale=0.05))[0]
  assert np.mean(np.asarray(small.response[:, 0]) == np.asarray(plain.response[:, 0])) > 0.9
  assert np.all(np.asarray(small.logprobs[:, 0]) != np.asarray(plain.logprobs[:, 0]))
  assert delta.mean() > 0.05


def test_gap_to_trainer_grows_with_noise_scale(sample):
  means = [sample(Mismatch(noise_scale=s))[2].mean() for s in (0.0, 0.05, 0.3, 1.0)]
  assert means[0] < 1e-5                                  # no noise: the sampler's log-probs are the trainer's
  for lo, hi in zip(means[1:], means[2:]):
    assert hi > 2 * lo, means
  # Small noise is a first-order effect: mean |Δ| ~ σ x E sqrt((1 - π_y)² + Σ π_v²) < σ.
  assert 0.2 * 0.05 < means[1] < 0.05, means


def _buckets(trainer_logp, delta):
  """(mean |Δ| on tokens with trainer p > 0.9, on p < 0.3, and the same of |Δ| / (1 - p))."""
  p = np.exp(trainer_logp)
  hi, lo = p > 0.9, p < 0.3
  assert hi.sum() >= 30 and lo.sum() >= 100, (hi.sum(), lo.sum())   # the model gives both kinds of token
  norm = delta / (1 - p)
  return delta[hi].mean(), delta[lo].mean(), norm[hi].mean(), norm[lo].mean()


def test_tail_noise_concentrates_on_low_probability_tokens(sample):
  _, trainer_u, delta_u = sample(Mismatch(noise_scale=0.3, noise_kind="uniform"))
  _, trainer_t, delta_t = sample(Mismatch(noise_scale=0.3, noise_kind="tail"))
  u_hi, u_lo, un_hi, un_lo = _buckets(trainer_u, delta_u)
  t_hi, t_lo, tn_hi, tn_lo = _buckets(trainer_t, delta_t)
  # Comparable size where it matters: on low-probability tokens both move the log-probs alike.
  assert 0.6 < t_lo / u_lo < 1.1, (t_lo, u_lo)
  # Tail noise: confident tokens barely move (measured ratio ~0.025).
  assert t_hi < 0.1 * t_lo, (t_hi, t_lo)
  # Uniform logit noise is already damped on confident tokens by the softmax (|Δ| ~ σ (1 - p): measured
  # ratio ~0.05), so the honest contrast is in units of (1 - p): flat for uniform noise (~1.0), about half
  # for tail noise on confident tokens (~0.5), and the raw contrast of tail noise is the stronger one.
  assert un_hi > 0.8 * un_lo, (un_hi, un_lo)
  assert tn_hi < 0.7 * tn_lo, (tn_hi, tn_lo)
  assert t_hi / t_lo < 0.75 * (u_hi / u_lo), (t_hi / t_lo, u_hi / u_lo)


def test_tail_noise_is_scaled_by_one_minus_the_sampling_probability():
  cfg = SamplingConfig(max_new_tokens=1, temperature=0.7, top_p=0.9)
  x = 3.0 * jax.random.normal(jax.random.key(4), (8, CFG.vocab_size))
  k = jax.random.key(5)
  z = jax.random.normal(k, x.shape)
  p = np.exp(np.asarray(processed_logprobs(x, cfg)))
  assert (p == 0).any() and (p > 0.5).any()               # truncated tokens and confident ones both present
  tail = np.asarray(LogitNoise(0.5, "tail", cfg)(x, k) - x)
  np.testing.assert_allclose(tail, 0.5 * (1 - p) * z, atol=1e-6)
  np.testing.assert_allclose(tail[p == 0], 0.5 * np.asarray(z)[p == 0], atol=1e-6)   # outside the nucleus
  np.testing.assert_allclose(LogitNoise(0.5, "uniform", cfg)(x, k) - x, 0.5 * z, atol=1e-6)


def test_bfloat16_copy_has_a_small_gap_and_the_same_params(setup, sample):
  params = setup[0]
  m = Mismatch(dtype="bfloat16")
  assert m.active and m.logits_hook(SAMPLING) is None
  bf16 = sampling_model(MODEL, m)
  assert bf16.cfg == CFG.replace(dtype="bfloat16") and bf16.cfg.param_dtype == CFG.param_dtype
  want = jax.eval_shape(lambda: bf16.init(jax.random.key(0), jnp.zeros((1, 1), jnp.int32))["params"])
  have = jax.tree.map(lambda a: jax.ShapeDtypeStruct(a.shape, a.dtype), params)
  assert jax.tree.structure(want) == jax.tree.structure(have) and jax.tree.leaves(want) == jax.tree.leaves(have)
  out, _, delta = sample(m)
  assert out.logprobs.dtype == jnp.float32
  assert 1e-4 < delta.mean() < 0.05, delta.mean()        # measured ~0.01: bf16 rounding of a 30x LM head
  assert delta.mean() < 0.5 * sample(Mismatch(noise_scale=0.3))[2].mean()


def test_config_section_and_bad_values():
  section = mismatch_defaults()
  assert from_config(section) == Mismatch() and not from_config(section).active
  assert set(field_comments(mismatch_defaults)) == {"dtype", "noise_scale", "noise_kind"}
  section.update(dtype="bfloat16", noise_scale=0.2, noise_kind="tail")
  assert from_config(section) == Mismatch("bfloat16", 0.2, "tail")
  hash(LogitNoise(0.2, "tail", SAMPLING))                 # a static argument of the jitted sampler
  with pytest.raises(ValueError, match="noise_kind='gauss'.*'uniform', 'tail'"):
    Mismatch(noise_kind="gauss")
  with pytest.raises(ValueError, match="noise_scale=-0.1 must be a finite number >= 0"):
    Mismatch(noise_scale=-0.1)
  with pytest.raises(ValueError, match="noise_scale=nan"):
    Mismatch(noise_scale=float("nan"))
  with pytest.raises(ValueError, match="dtype='fp8'.*bfloat16"):
    Mismatch(dtype="fp8")
  with pytest.raises(ValueError, match="noise_kind"):
    LogitNoise(0.1, "Tail")
  with pytest.raises(ValueError, match="noise_kind='heavy'"):
    from_config(ml_collections.ConfigDict(dict(dtype="", noise_scale=0.1, noise_kind="heavy")))
