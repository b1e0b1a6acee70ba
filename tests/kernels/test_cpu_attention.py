"""`kernels.cpu_attention`: the C++ XLA:CPU kernel against its jnp reference (values and gradients, with and
without the q/k norm), inside the model against the XLA path, under a sharded mesh, and its errors.

The tests that build the kernel skip, naming the compiler, where `ca.find_compiler()` finds none (CI installs
g++ first, `.ci/run`); the input checks and the missing-compiler error run everywhere."""
import functools
import os
import re
import stat
import subprocess
import sys
from pathlib import Path

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from jax.sharding import NamedSharding, PartitionSpec as P

from kernels import cpu_attention as ca
from rlkit.models.transformer import Transformer, TransformerConfig, rope_tables
from rlkit.parallel.mesh import make_mesh



def missing_compiler_reason() -> str:
  """Why the kernel cannot be built here ("" where it can): the compiler `kernels/cpu_attention.py` looks up."""
  if ca.find_compiler() is not None:
    return ""
  return (f"no C++ compiler: {ca.compiler()!r} ($CXX, default g++) was not found, and kernels/cpu_attention.py "
          f"builds the kernel with it; install g++ (apt-get install g++) or set $CXX")


needs_compiler = pytest.mark.skipif(bool(missing_compiler_reason()), reason=missing_compiler_reason())

B, T, KV, G, HD = 3, 40, 2, 3, 32       # T: not a multiple of 16 (the kernel pads its scratch to 48)


def _inputs(dtype, batch=B):
  kx, ks, kc = jax.random.split(jax.random.key(0), 3)
  qkv = jax.random.normal(kx, (batch, T, KV, G + 2, HD)).astype(dtype)
  scales = tuple((1 + 0.2 * jax.random.normal(k, (HD,))).astype(dtype) for k in jax.random.split(ks))
  start = jnp.array([0, 7, 0, 3][:batch])[:, None]                     # row 1 left-padded by 7
  real = jnp.arange(T)[None, :] >= start
  positions = jnp.maximum(jnp.arange(T)[None, :] - start, 0)
  cos, sin = rope_tables(positions, HD, 10_000.0, dtype)
  allowed = real[:, None, :] & (jnp.arange(T)[None, :] <= jnp.arange(T)[:, None])[None]
  allowed = allowed.at[2, 5].set(False)                                 # one query with no allowed key
  cot = jax.random.normal(kc, (batch, T, KV, G, HD))
  return qkv, scales, cos, sin, allowed, cot


def _live(allowed):
  return jnp.any(allowed, -1)[:, :, None, None, None]                   # queries with an allowed key


@needs_compiler
@pytest.mark.parametrize("causal,norm,dtype", [(True, True, jnp.float32), (False, True, jnp.float32),
                                               (True, False, jnp.float32), (True, True, jnp.bfloat16)])
def test_values_and_gradients_equal_the_reference(causal, norm, dtype):
  qkv, scales, cos, sin, allowed, cot = _inputs(dtype)
  scales = scales if norm else None
  live = _live(allowed)
  out, vjp = jax.vjp(lambda x, s: ca.cpu_attention(x, allowed, cos, sin, s, 1e-6, causal), qkv, scales)
  ref, ref_vjp = jax.vjp(lambda x, s: ca.cpu_attention_reference(x, allowed, cos, sin, s, 1e-6), qkv, scales)
  assert out.dtype == jnp.float32 and out.shape == (B, T, KV, G, HD)
  np.testing.assert_allclose(np.where(live, out, 0), np.where(live, ref, 0), atol=2e-6)
  (d_qkv, d_scales), (r_qkv, r_scales) = vjp(cot * live), ref_vjp(cot * live)
  tol = 5e-5 if dtype == jnp.float32 else 3e-2       # bf16: the gradients are rounded to the inputs' dtype
  assert d_qkv.dtype == dtype
  np.testing.assert_allclose(np.asarray(d_qkv, np.float32), np.asarray(r_qkv, np.float32), atol=tol)
  assert (d_scales is None) == (not norm)
  for d, r in zip(d_scales or (), r_scales or ()):
    np.testing.assert_allclose(np.asarray(d, np.float32), np.asarray(r, np.float32), rtol=1e-4,
                               atol=tol * np.abs(np.asarray(r, np.float32)).max())


@needs_compiler
def test_a_query_with_no_allowed_key_is_uniform_and_passes_no_gradient():
  qkv, scales, cos, sin, allowed, cot = _inputs(jnp.float32)
  out, vjp = jax.vjp(lambda x: ca.cpu_attention(x, allowed, cos, sin, scales, 1e-6, True), qkv)
  # Causal: uniform over the keys it considers, slots 0..5 of batch row 2.
  v = qkv[2, :6, :, G + 1]                                               # [6, KV, hd]
  np.testing.assert_allclose(out[2, 5], jnp.broadcast_to(v.mean(0)[:, None], (KV, G, HD)), atol=1e-6)
  (d_qkv,) = vjp(jnp.zeros_like(cot).at[2, 5].set(cot[2, 5]))
  assert not np.any(np.asarray(d_qkv[:, :, :, :G + 1]))                 # no gradient to any query or key
  assert np.any(np.asarray(d_qkv[2, :6, :, G + 1]))                     # the values it averaged get some


def _model_cfg(attention, **kw):
  return TransformerConfig(vocab_size=64, hidden_size=64, intermediate_size=96, num_layers=2, num_heads=4,
                           num_kv_heads=2, head_dim=32, attention=attention, **kw)


@needs_compiler
@pytest.mark.parametrize("qk_norm", [True, False])
def test_model_with_the_kernel_equals_the_xla_attention(qk_norm):
  tokens = jax.random.randint(jax.random.key(1), (2, 24), 0, 64)
  mask = jnp.arange(24)[None, :] >= jnp.array([[0], [5]])               # left padding
  xla = Transformer(_model_cfg("xla", qk_norm=qk_norm))
  kernel = Transformer(_model_cfg("cpu_kernel", qk_norm=qk_norm))
  params = xla.init(jax.random.key(0), tokens)["params"]
  assert jax.tree.structure(params) == jax.tree.structure(kernel.init(jax.random.key(0), tokens)["params"])

  def loss(model, p):
    logits = model.apply({"params": p}, tokens, attention_mask=mask)
    return jnp.sum(jnp.where(mask[..., None], jax.nn.log_softmax(logits), 0.0) ** 2) / 1e4

  # Jitted: eager autodiff compiles every op on its own.
  (l_x, g_x), (l_k, g_k) = (jax.jit(jax.value_and_grad(functools.partial(loss, m)))(params) for m in (xla, kernel))
  np.testing.assert_allclose(l_k, l_x, rtol=1e-5)
  for path, a, b in zip(jax.tree_util.tree_leaves_with_path(g_k), jax.tree.leaves(g_k), jax.tree.leaves(g_x)):
    np.testing.assert_allclose(a, b, atol=1e-5, rtol=1e-4, err_msg=jax.tree_util.keystr(path[0]))


@needs_compiler
def test_sharded_call_equals_one_device():
  qkv, scales, cos, sin, allowed, cot = _inputs(jnp.float32, batch=4)   # batch 4: splits over data=2

  def grads(qkv, scales, cos, sin):
    return jax.vjp(lambda x, s: ca.cpu_attention(x, allowed, cos, sin, s, 1e-6, True), qkv, scales)[1](cot)

  want = jax.jit(grads)(qkv, scales, cos, sin)
  mesh = make_mesh({"data": 2, "tensor": 2}, jax.devices()[:4])
  with jax.set_mesh(mesh):
    args = (jax.device_put(qkv, NamedSharding(mesh, P("data", None, "tensor"))), scales,
            *(jax.device_put(x, NamedSharding(mesh, P("data"))) for x in (cos, sin)))
    got = jax.jit(grads)(*args)
    hlo = jax.jit(grads).lower(*args).compile().as_text()
  for a, b in zip(jax.tree.leaves(got), jax.tree.leaves(want)):
    np.testing.assert_allclose(a, b, atol=2e-6)
  assert "all-gather" not in hlo          # each device runs its own shard: no operand is gathered


def test_bad_inputs_name_the_fix():
  qkv, scales, cos, sin, allowed, _ = _inputs(jnp.float32)
  with pytest.raises(ValueError, match="multiple of 32"):
    ca.cpu_attention(qkv[..., :16], allowed, cos[..., :16], sin[..., :16], None)
  with pytest.raises(ValueError, match="do not fit"):
    ca.cpu_attention(qkv, allowed[:, :3], cos, sin, scales)
  with pytest.raises(ValueError, match="G \\+ 2"):
    ca.cpu_attention(qkv[:, :, :, :2], allowed, cos, sin, scales)
  with pytest.raises(ValueError, match="runs on gpu; use model.attention='xla'"):
    with pytest.MonkeyPatch.context() as m:
      m.setattr(jax, "default_backend", lambda: "gpu")
      ca.cpu_attention(qkv, allowed, cos, sin, scales)
  with pytest.raises(ValueError, match="head_dim % 32"):
    _model_cfg("cpu_kernel").replace(head_dim=48)
  with pytest.raises(ValueError, match="xla"):
    _model_cfg("flash")


def test_a_missing_compiler_is_an_error_and_builds_nothing(tmp_path, monkeypatch):
  monkeypatch.setenv("RLKIT_KERNEL_CACHE", str(tmp_path / "cache"))
  monkeypatch.setenv("CXX", "no-such-compiler-rlkit")
  with pytest.raises(RuntimeError, match="'no-such-compiler-rlkit' was not found.*model.attention='xla'"):
    ca.library_path()
  assert not (tmp_path / "cache").exists() or not list((tmp_path / "cache").iterdir())   # nothing half-built


def test_find_compiler_follows_cxx_then_path(tmp_path, monkeypatch):
  bin_dir = tmp_path / "bin"
  bin_dir.mkdir()
  fake = bin_dir / "g++"
  fake.write_text("#!/bin/sh\n")
  fake.chmod(fake.stat().st_mode | stat.S_IXUSR)
  monkeypatch.delenv("CXX", raising=False)
  monkeypatch.setenv("PATH", str(bin_dir))
  assert ca.compiler() == "g++" and ca.find_compiler() == str(fake)
  monkeypatch.setenv("PATH", str(tmp_path))                                       # no g++ on PATH
  assert ca.find_compiler() is None and "'g++'" in missing_compiler_reason()
  monkeypatch.setenv("CXX", str(fake))                                            # $CXX as a path
  assert ca.find_compiler() == str(fake) and missing_compiler_reason() == ""
  monkeypatch.setenv("CXX", str(tmp_path / "missing" / "clang++"))
  assert ca.find_compiler() is None and "clang++" in missing_compiler_reason()


def test_without_a_compiler_the_kernel_tests_skip_naming_it(tmp_path):
  """The skip path end to end: this file in a fresh pytest with no $CXX and no g++ on PATH."""
  env = {k: v for k, v in os.environ.items() if k != "CXX"}
  env["PATH"] = str(tmp_path)
  env["RLKIT_KERNEL_CACHE"] = str(tmp_path / "cache")          # a built library must not be picked up
  root = Path(__file__).resolve().parents[2]
  done = subprocess.run([sys.executable, "-m", "pytest", "-q", "-rs", "-n", "0", "-p", "no:cacheprovider", __file__,
                         "-k", "not without_a_compiler"], cwd=root, env=env, capture_output=True, text=True,
                        timeout=600)
  assert done.returncode == 0, done.stdout[-4000:] + done.stderr[-4000:]
  skips = re.findall(r"^SKIPPED \[(\d+)\] .*no C\+\+ compiler: 'g\+\+'", done.stdout, re.M)
  assert sum(map(int, skips)) == 9, done.stdout[-4000:]        # 4 + 1 + 2 + 1 + the cached build
  assert re.search(r"\b3 passed, 9 skipped\b", done.stdout), done.stdout[-4000:]


@needs_compiler
def test_build_is_cached(tmp_path, monkeypatch):
  monkeypatch.setenv("RLKIT_KERNEL_CACHE", str(tmp_path / "cache"))
  monkeypatch.delenv("CXX", raising=False)
  lib = ca.library_path()
  assert lib.parent == tmp_path / "cache" and lib.exists()
  stamp = os.stat(lib).st_mtime_ns
  assert ca.library_path() == lib and os.stat(lib).st_mtime_ns == stamp          # reused, not rebuilt
  assert [p.name for p in lib.parent.iterdir()] == [lib.name]                     # no temporary left behind
