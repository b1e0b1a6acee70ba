"""`kernels.sparse_delta`: the compare + compaction and scatter-apply kernels against their jnp references,
bit for bit. On CPU the kernels run interpreted; on a GPU the same tests run them compiled.

Cases share a few (shape, dtype, capacity) combinations: each combination compiles the kernels (interpreted)
and the references once, and compiling is most of these tests' time."""
import functools

import jax
import jax.numpy as jnp
import ml_dtypes
import numpy as np
import pytest

from kernels import sparse_delta as sd

INTERPRET = jax.default_backend() != "gpu"
BLOCKS = sd.SparseDeltaBlocks(compare=64, apply=32)      # small blocks: several grid steps on small arrays
N_BF16 = 300                                             # 4 blocks of 64 + 44: a ragged last block
SHAPE_F32, CAP_F32 = (37, 29), 64                        # 1073 elements: 16 blocks of 64 + 49

compact_ref = jax.jit(sd.compact_changes_reference, static_argnames="capacity")
apply_ref = jax.jit(sd.scatter_apply_reference)


def _bits(x) -> np.ndarray:
  x = np.asarray(x)
  return x.view({1: np.uint8, 2: np.uint16, 4: np.uint32}[x.dtype.itemsize])


def _from_bits(bits, dtype) -> jax.Array:
  return jnp.asarray(np.asarray(bits).view(dtype))


def _pair(shape, dtype, rate, seed=0):
  """(new, base): base random, new = base with about `rate` of its elements changed (numpy: no compiles)."""
  rng = np.random.default_rng(seed)
  base = rng.standard_normal(shape).astype(dtype)
  new = np.where(rng.random(shape) < rate, (base.astype(np.float32) * 1.5 + 1.0).astype(dtype), base)
  return jnp.asarray(new), jnp.asarray(base)


def _compare(new, base, capacity):
  """compact_changes through the kernel and the reference: bit-equal; returns numpy (idx, val, count)."""
  got = sd.compact_changes(new, base, capacity=capacity, blocks=BLOCKS, interpret=INTERPRET)
  want = compact_ref(new, base, capacity=capacity)
  for g, w in zip(got, want):
    assert g.dtype == w.dtype and g.shape == w.shape
    np.testing.assert_array_equal(np.asarray(g), np.asarray(w))
  return tuple(np.asarray(g) for g in got)


def _check_entries(new, base, idx, val, count, capacity):
  changed = np.flatnonzero(_bits(new).reshape(-1) != _bits(base).reshape(-1))
  assert count == changed.size                              # the true count, also past the capacity
  kept = min(changed.size, capacity)
  np.testing.assert_array_equal(idx[:kept], changed[:kept])  # ascending flat indices
  np.testing.assert_array_equal(val[:kept], _bits(new).reshape(-1)[changed[:kept]])
  assert np.all(idx[kept:] == -1) and np.all(val[kept:] == 0)


def _bf16_cases():
  new, base = _pair((N_BF16,), ml_dtypes.bfloat16, 0.1)
  specials = np.array([0x0000, 0x3F80, 0x7FC0, 0x7FC0, 0x8000], np.uint16)     # 0.0, 1.0, NaN, NaN, -0.0
  changed_to = np.array([0x8000, 0x3F80, 0x7FC1, 0x7FC0, 0x0000], np.uint16)   # -0.0, 1.0, NaN', NaN, 0.0
  base_bits, new_bits = np.zeros(N_BF16, np.uint16), np.zeros(N_BF16, np.uint16)
  base_bits[:5], new_bits[:5] = specials, changed_to
  return {
      "random 10%": (new, base),
      "unchanged": (base, base),
      "all changed": (jnp.asarray(np.arange(1, N_BF16 + 1).astype(ml_dtypes.bfloat16)),
                      jnp.zeros((N_BF16,), jnp.bfloat16)),
      # Bits, not values: -0.0 == 0.0 and NaN != NaN as floats; only the bit differences count.
      "signed zero and NaN payloads": (_from_bits(new_bits, ml_dtypes.bfloat16),
                                       _from_bits(base_bits, ml_dtypes.bfloat16)),
  }


@pytest.mark.parametrize("case", list(_bf16_cases()))
def test_bf16_compaction_matches_reference(case):
  new, base = _bf16_cases()[case]
  idx, val, count = _compare(new, base, capacity=N_BF16)
  _check_entries(new, base, idx, val, int(count), N_BF16)
  expected_count = {"unchanged": 0, "all changed": N_BF16, "signed zero and NaN payloads": 3}
  if case in expected_count:
    assert count == expected_count[case]
  if case == "signed zero and NaN payloads":
    np.testing.assert_array_equal(idx[:3], [0, 2, 4])
    np.testing.assert_array_equal(val[:3], [0x8000, 0x7FC1, 0x0000])


@pytest.mark.parametrize("rate", [0.03, 0.3])       # 0.3: about 320 changes in 64 slots, an overflow
def test_f32_2d_compaction_and_overflow(rate):
  new, base = _pair(SHAPE_F32, np.float32, rate, seed=3)
  idx, val, count = _compare(new, base, capacity=CAP_F32)
  _check_entries(new, base, idx, val, int(count), CAP_F32)
  assert (count > CAP_F32) == (rate == 0.3)          # overflow is reported by the count, never hidden


def test_bool_smaller_than_one_block():
  base = jnp.array([True, False, True, False, True])
  idx, _, count = _compare(base.at[1].set(True).at[4].set(False), base, capacity=4)
  assert count == 2 and list(idx[:3]) == [1, 4, -1]


def _apply(dst, idx, val):
  got = sd.scatter_apply(dst, idx, val, blocks=BLOCKS, interpret=INTERPRET)
  want = apply_ref(dst, idx, val)
  assert got.dtype == dst.dtype and got.shape == dst.shape
  np.testing.assert_array_equal(_bits(got), _bits(want))
  return got


@pytest.mark.parametrize("case", ["random 10%", "all changed", "signed zero and NaN payloads"])
def test_bf16_compact_then_apply_reproduces_new(case):
  new, base = _bf16_cases()[case]
  idx, val, _ = sd.compact_changes(new, base, capacity=N_BF16, blocks=BLOCKS, interpret=INTERPRET)
  np.testing.assert_array_equal(_bits(_apply(base, idx, val)), _bits(new))


def test_f32_2d_compact_then_apply_reproduces_new():
  new, base = _pair(SHAPE_F32, np.float32, 0.03, seed=3)
  idx, val, count = sd.compact_changes(new, base, capacity=CAP_F32, blocks=BLOCKS, interpret=INTERPRET)
  assert int(count) <= CAP_F32
  np.testing.assert_array_equal(_bits(_apply(base, idx, val)), _bits(new))


def test_apply_ignores_padding_anywhere_and_out_of_range():
  dst = jnp.zeros(SHAPE_F32, jnp.float32)
  size = dst.size
  # Padding before, between and after valid entries; size and size + 50 are past the end (dropped, like
  # mode="drop"); entries 10.. are padding, so the last of the two apply blocks is all padding.
  idx = np.full(CAP_F32, -1, np.int32)
  idx[:10] = [-1, 3, -1, 0, size - 1, -1, size, 7, size + 50, -1]
  out = _bits(_apply(dst, jnp.asarray(idx), jnp.full((CAP_F32,), -5.0, jnp.float32))).reshape(-1)
  expect = np.zeros(size, np.float32)
  expect[[0, 3, 7, size - 1]] = -5.0
  np.testing.assert_array_equal(out, _bits(expect))


def test_apply_takes_values_or_bits():
  new, base = _bf16_cases()["signed zero and NaN payloads"]
  idx, val_bits, _ = sd.compact_changes(new, base, capacity=N_BF16, blocks=BLOCKS, interpret=INTERPRET)
  as_values = jax.lax.bitcast_convert_type(val_bits, jnp.bfloat16)
  np.testing.assert_array_equal(_bits(_apply(base, idx, as_values)), _bits(new))


def test_input_errors_are_clear():
  x = jnp.zeros((4,), jnp.float32)
  with pytest.raises(ValueError, match="same shape"):
    sd.compact_changes(x, jnp.zeros((5,), jnp.float32), capacity=2, interpret=True)
  with pytest.raises(ValueError, match="capacity"):
    sd.compact_changes_reference(x, x, capacity=0)
  with pytest.raises(ValueError, match="bits"):
    sd.scatter_apply_reference(x, jnp.zeros((1,), jnp.int32), jnp.zeros((1,), jnp.uint16))
  with pytest.raises(ValueError, match="power of two"):
    sd.SparseDeltaBlocks(compare=100)
