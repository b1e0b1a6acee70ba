// Masked softmax attention over grouped query heads for XLA:CPU, forward and backward, as XLA FFI handlers.
//
// Why a hand-written kernel: XLA:CPU runs attention's batched products ([T*G, hd] x [hd, S] per batch row
// and KV head) through per-product Eigen calls at 60-130 GFLOP/s, against 290-345 for the model's weight
// matmuls, and writes the [T*G, S] scores and probabilities out to memory between its fusions. Here each
// (batch row, KV head) pair is one task: its scores, probabilities and their gradients stay in the core's L2,
// and the products run through one register-blocked micro-kernel. The maths is `rlkit/models/attention.py`'s
// (see there); the backward pass recomputes the probabilities from the saved log-sum-exp, as FlashAttention's.
//
// Layouts (row-major, float32), the model's own, so that XLA transposes nothing on either side: q, o, do
// and dq [B, T, KV, G, hd]; k, v, dk, dv [B, S, KV, hd]; allowed [B, T, S] as uint8 (nonzero: query t may
// attend to key slot s); lse [B, KV, G, T]. causal != 0 promises that query t never attends past slot t
// (self-attention over one sequence, S == T), so the products skip the score blocks above the diagonal. A
// query row with no allowed key is uniform over the keys it considers (all S, or slots <= t when causal) and
// passes no gradient to q or k; its lse is NaN.
// hd must be a multiple of 16 (one vector of floats).

#include <algorithm>
#include <atomic>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <memory>
#include <thread>
#include <vector>

#ifdef __AVX512F__
#include <immintrin.h>
#endif

#include "xla/ffi/api/ffi.h"

namespace ffi = xla::ffi;

namespace {

// 16 floats: one AVX-512 register when compiled with -march=native on such a CPU (two AVX2 ones otherwise).
typedef float vf __attribute__((vector_size(64)));
typedef int32_t vi __attribute__((vector_size(64)));
typedef uint8_t vb __attribute__((vector_size(16)));
constexpr int kLanes = 16;

inline vf load(const float* p) { vf v; std::memcpy(&v, p, sizeof v); return v; }
inline void store(float* p, vf v) { std::memcpy(p, &v, sizeof v); }
// `vf{} + x` would compile to a scalar add of 0 (not foldable: -0 + 0 = +0) before every broadcast.
inline vf splat(float x) { return vf{x, x, x, x, x, x, x, x, x, x, x, x, x, x, x, x}; }
// Lanes [s, s + 16) of a mask row of S slots: allowed, and below `keys` (the keys the row considers).
inline vi allowed16(const uint8_t* allowed, int s, int keys, int S) {
  vi m;
  if (s + kLanes <= S) {
#ifdef __AVX512F__
    // GCC assembles __builtin_convertvector of 16 bytes lane by lane; vpmovzxbd is one instruction.
    __m512i w = _mm512_cvtepu8_epi32(_mm_loadu_si128(reinterpret_cast<const __m128i*>(allowed + s)));
    std::memcpy(&m, &w, sizeof m);
    m = m != 0;
#else
    vb b;
    std::memcpy(&b, allowed + s, sizeof b);
    m = __builtin_convertvector(b, vi) != 0;
#endif
  } else {
    for (int l = 0; l < kLanes; ++l) m[l] = (s + l < S && allowed[s + l]) ? -1 : 0;
  }
  if (s + kLanes <= keys) return m;
  const vi iota = {0, 1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13, 14, 15};
  return m & (iota < keys - s);
}
// Horizontal sum and max by halving: 4 steps instead of 15 lane extractions.
template <class Op>
inline float reduce(vf v, Op op) {
  typedef float v8 __attribute__((vector_size(32)));
  typedef float v4 __attribute__((vector_size(16)));
  v8 a = op(__builtin_shufflevector(v, v, 0, 1, 2, 3, 4, 5, 6, 7),
            __builtin_shufflevector(v, v, 8, 9, 10, 11, 12, 13, 14, 15));
  v4 b = op(__builtin_shufflevector(a, a, 0, 1, 2, 3), __builtin_shufflevector(a, a, 4, 5, 6, 7));
  return op(op(b[0], b[1]), op(b[2], b[3]));
}
inline float hsum(vf v) { return reduce(v, [](auto x, auto y) { return x + y; }); }
inline float hmax(vf v) { return reduce(v, [](auto x, auto y) { return x > y ? x : y; }); }

// exp(x) for x <= 0 (softmax's shifted scores): 2^n * p(r) with x = n ln2 + r, |r| <= ln2 / 2, and a degree 6
// polynomial for e^r (relative error ~2e-7). Inputs below -87 flush to 0.
inline vf exp_neg(vf x) {
  const vf lo = splat(-87.0f);
  vi tiny = x < lo;
  x = tiny ? lo : x;
  const float magic = 12582912.0f;                 // 1.5 * 2^23: adding it rounds to the nearest integer
  vf t = x * splat(1.44269504f) + splat(magic);
  vf n = t - splat(magic);
  vf r = x - n * splat(0.693145751953125f) - n * splat(1.428606765330187e-6f);
  vf p = splat(1.0f / 720);
  p = p * r + splat(1.0f / 120);
  p = p * r + splat(1.0f / 24);
  p = p * r + splat(1.0f / 6);
  p = p * r + splat(0.5f);
  p = p * r + splat(1.0f);
  p = p * r + splat(1.0f);
  vi bits = (__builtin_convertvector(n, vi) + 127) << 23;
  vf scale;
  std::memcpy(&scale, &bits, sizeof scale);
  return tiny ? splat(0.0f) : p * scale;
}

// C[MR, 16 NV] (+)= A[MR, K] B[K, 16 NV]: A(i, kk) = a[i * ars + kk * acs] (either layout), B row-major.
// MR = 6, NV = 4 keeps 24 accumulators, 4 B vectors and one broadcast in the 32 AVX-512 registers.
template <int MR, int NV>
void micro(int k, const float* a, long ars, long acs, const float* b, long ldb, float* c, long ldc, bool add) {
  vf acc[MR][NV];
#pragma GCC unroll 8
  for (int i = 0; i < MR; ++i)
#pragma GCC unroll 4
    for (int v = 0; v < NV; ++v) acc[i][v] = vf{};
  for (int kk = 0; kk < k; ++kk) {
    vf bv[NV];
#pragma GCC unroll 4
    for (int v = 0; v < NV; ++v) bv[v] = load(b + kk * ldb + kLanes * v);
#pragma GCC unroll 8
    for (int i = 0; i < MR; ++i) {
      vf av = splat(a[i * ars + kk * acs]);
#pragma GCC unroll 4
      for (int v = 0; v < NV; ++v) acc[i][v] += av * bv[v];
    }
  }
#pragma GCC unroll 8
  for (int i = 0; i < MR; ++i)
#pragma GCC unroll 4
    for (int v = 0; v < NV; ++v) {
      float* p = c + i * ldc + kLanes * v;
      store(p, add ? load(p) + acc[i][v] : acc[i][v]);
    }
}

using Micro = void (*)(int, const float*, long, long, const float*, long, float*, long, bool);
constexpr int kMR = 6;

template <int MR>
constexpr Micro kRow[4] = {micro<MR, 1>, micro<MR, 2>, micro<MR, 3>, micro<MR, 4>};
constexpr const Micro* kMicro[kMR + 1] = {nullptr, kRow<1>, kRow<2>, kRow<3>, kRow<4>, kRow<5>, kRow<6>};

struct Span { int k0, k1, n; };

// C[m, :] (+)= A B, where the rows [i0, i1) of each block contract kk in [k0, k1) and compute the columns
// [0, n), as span(i0, i1) says (n a multiple of 16): the causal products skip what the mask zeroes.
// Rows go in chunks of kChunk, each chunk sweeping the column blocks, so that a column block of B (at most
// 64 columns by K rows) stays in L1 while the chunk's row blocks use it; the scores' 132 GFLOP/s row-block
// order reread all of K^T (64 KB) from L2 for every 6 rows.
constexpr int kChunk = 8 * kMR;

template <class SpanFn>
void gemm(int m, const float* a, long ars, long acs, const float* b, long ldb, float* c, long ldc, bool add,
          SpanFn span) {
  for (int c0 = 0; c0 < m; c0 += kChunk) {
    int c1 = std::min(m, c0 + kChunk);
    int n_max = 0;
    for (int i0 = c0; i0 < c1; i0 += kMR) n_max = std::max(n_max, span(i0, std::min(c1, i0 + kMR)).n);
    for (int j = 0; j < n_max; j += 4 * kLanes) {
      for (int i0 = c0; i0 < c1; i0 += kMR) {
        int mr = std::min(kMR, c1 - i0);
        Span s = span(i0, i0 + mr);
        if (j >= s.n) continue;
        int nv = std::min(4, (s.n - j) / kLanes);
        kMicro[mr][nv - 1](s.k1 - s.k0, a + i0 * ars + long(s.k0) * acs, ars, acs, b + long(s.k0) * ldb + j, ldb,
                           c + long(i0) * ldc + j, ldc, add);
      }
    }
  }
}

inline int round16(int n) { return (n + kLanes - 1) / kLanes * kLanes; }

struct Shape {
  int64_t B, T, S, KV, G, hd;
  bool causal;
  int Sp() const { return round16(int(S)); }
  // Row stride of the [*, Sp] scratch matrices, one vector more than Sp: at a power-of-two stride (Sp = 256,
  // 1 KB) a 64-row panel of K^T maps onto a quarter of L1's sets. (At M the scores ran at the same speed
  // either way, within this machine's noise; the padding costs 6% more scratch.)
  int ld() const { return Sp() + kLanes; }
  long q_row() const { return KV * G * hd; }      // q, o, do, dq: [B, T, KV, G, hd]
  long k_row() const { return KV * hd; }          // k, v, dk, dv: [B, S, KV, hd]
  // Keys query t considers: all S, or slots <= t when causal.
  int keys(int t) const { return causal ? t + 1 : int(S); }
};

// Per-thread scratch, reused across calls.
float* scratch(std::vector<float>& buf, size_t n) {
  if (buf.size() < n) buf.resize(n);
  return buf.data();
}

// Kt [hd, Sp] (row stride ld_kt) = K^T of the S rows of K (row stride ld_k), zero-padded to Sp columns.
// 16 rows of K at a time: their 64 cache lines stay in L1 while each is read hd times (row by row, K's 1 KB
// row stride put every line in a quarter of L1's sets and this took 18 us per M pair instead of 4.5).
void transpose_padded(const float* k, long ld_k, int S, int hd, int Sp, float* kt, long ld_kt) {
  for (int s0 = 0; s0 < Sp; s0 += kLanes) {
    for (int h = 0; h < hd; ++h) {
      vf col;
      for (int l = 0; l < kLanes; ++l) col[l] = s0 + l < S ? k[(s0 + l) * ld_k + h] : 0.0f;
      store(kt + h * ld_kt + s0, col);
    }
  }
}

// Scores [T, Sp] of the T query rows of q (row stride ld) against keys [0, keys(last row of the block)),
// rounded up to 16 columns.
void scores(const Shape& sh, const float* q, long ld, const float* kt, float* out) {
  int hd = int(sh.hd), Sp = sh.Sp();
  gemm(int(sh.T), q, ld, 1, kt, sh.ld(), out, sh.ld(), false,
       [&](int, int i1) { return Span{0, hd, std::min(round16(sh.keys(i1 - 1)), Sp)}; });
}

// One row's unnormalised probabilities exp(x - max), in place over `row` (scores in, zero past the considered
// keys up to Sp). Returns {log-sum-exp, 1 / sum}; for a row with no allowed key (then uniform over the
// considered keys) {NaN, 1 / keys}. The forward pass scales the output rows by 1 / sum instead of p.
std::pair<float, float> softmax_row(float* row, const uint8_t* allowed, int keys, int S, int Sp, float scale) {
  const float neg = -INFINITY;
  vf mx = splat(neg);
  for (int s = 0; s < keys; s += kLanes) {
    vf x = load(row + s);
    mx = allowed16(allowed, s, keys, S) ? (x > mx ? x : mx) : mx;
  }
  float m = hmax(mx) * scale;
  if (m == neg) {
    for (int s = 0; s < Sp; ++s) row[s] = s < keys ? 1.0f : 0.0f;
    return {NAN, 1.0f / keys};
  }
  vf sum = vf{};
  int end = round16(keys);
  for (int s = 0; s < end; s += kLanes) {
    vf p = exp_neg(load(row + s) * splat(scale) - splat(m));
    p = allowed16(allowed, s, keys, S) ? p : vf{};
    sum += p;
    store(row + s, p);
  }
  std::fill(row + end, row + Sp, 0.0f);
  float total = hsum(sum);
  return {m + std::log(total), 1.0f / total};
}

// p of one row recomputed from its scores and lse, and ds = p * (dp - d) * scale where allowed (0 elsewhere),
// both in place (row: scores -> p, drow: dp -> ds), zero past the considered keys up to Sp.
void softmax_grad_row(float* row, float* drow, const uint8_t* allowed, int keys, int S, int Sp, float scale,
                      float lse, float d) {
  if (std::isnan(lse)) {
    for (int s = 0; s < Sp; ++s) { row[s] = s < keys ? 1.0f / keys : 0.0f; drow[s] = 0.0f; }
    return;
  }
  int end = round16(keys);
  for (int s = 0; s < end; s += kLanes) {
    vf p = exp_neg(load(row + s) * splat(scale) - splat(lse));
    p = allowed16(allowed, s, keys, S) ? p : vf{};
    store(row + s, p);
    store(drow + s, p * (load(drow + s) - splat(d)) * splat(scale));
  }
  for (int s = end; s < Sp; ++s) { row[s] = 0.0f; drow[s] = 0.0f; }
}

// Runs f(0..n-1) on the caller and the pool's threads. Workers take items from a shared counter, so the
// caller never waits on a task that has not started (a pool busy elsewhere cannot deadlock it).
template <class F>
void parallel_for(ffi::ThreadPool& pool, int n, const F& f) {
  struct Shared { std::atomic<int> next{0}, done{0}; };
  auto shared = std::make_shared<Shared>();
  auto work = [shared, n, &f] {
    for (int i; (i = shared->next.fetch_add(1)) < n;) {
      f(i);
      shared->done.fetch_add(1, std::memory_order_release);
    }
  };
  int helpers = int(std::min<int64_t>(pool.num_threads(), n)) - 1;
  for (int h = 0; h < helpers; ++h) pool.Schedule([work] { work(); });
  work();
  while (shared->done.load(std::memory_order_acquire) < n) std::this_thread::yield();
}

// One (batch row, KV head) pair: its G query heads against the pair's keys and values. q, k, v, o point at
// the pair's first element; rows are q_row() and k_row() apart. lse: [G, T].
void forward_pair(const Shape& sh, const float* q, const float* k, const float* v, const uint8_t* allowed,
                  float* o, float* lse) {
  thread_local std::vector<float> kt_buf, p_buf, inv_buf;
  int T = int(sh.T), S = int(sh.S), Sp = sh.Sp(), hd = int(sh.hd), ld = sh.ld();
  long qr = sh.q_row(), kr = sh.k_row();
  float* kt = scratch(kt_buf, size_t(hd) * ld);
  float* p = scratch(p_buf, size_t(T) * ld);
  float* inv = scratch(inv_buf, T);
  float scale = 1.0f / std::sqrt(float(hd));
  transpose_padded(k, kr, S, hd, Sp, kt, ld);
  for (int g = 0; g < sh.G; ++g) {
    const float* qg = q + g * hd;
    float* og = o + g * hd;
    scores(sh, qg, qr, kt, p);
    for (int t = 0; t < T; ++t) {
      auto [row_lse, row_inv] = softmax_row(p + long(t) * ld, allowed + long(t) * S, sh.keys(t), S, Sp, scale);
      lse[g * T + t] = row_lse;
      inv[t] = row_inv;
    }
    gemm(T, p, ld, 1, v, kr, og, qr, false, [&](int, int i1) { return Span{0, sh.keys(i1 - 1), hd}; });
    for (int t = 0; t < T; ++t)
      for (int h = 0; h < hd; h += kLanes) store(og + t * qr + h, load(og + t * qr + h) * splat(inv[t]));
  }
}

void backward_pair(const Shape& sh, const float* q, const float* k, const float* v, const uint8_t* allowed,
                   const float* o, const float* lse, const float* dout, float* dq, float* dk, float* dv) {
  thread_local std::vector<float> kt_buf, vt_buf, p_buf, ds_buf;
  int T = int(sh.T), S = int(sh.S), Sp = sh.Sp(), hd = int(sh.hd), ld = sh.ld();
  long qr = sh.q_row(), kr = sh.k_row();
  float* kt = scratch(kt_buf, size_t(hd) * ld);
  float* vt = scratch(vt_buf, size_t(hd) * ld);
  float* p = scratch(p_buf, size_t(T) * ld);
  float* ds = scratch(ds_buf, size_t(T) * ld);
  float scale = 1.0f / std::sqrt(float(hd));
  transpose_padded(k, kr, S, hd, Sp, kt, ld);
  transpose_padded(v, kr, S, hd, Sp, vt, ld);
  // Key s only gets gradient from the query rows t >= s when causal.
  auto rows_after = [&](int i0, int) { return Span{sh.causal ? i0 : 0, T, hd}; };
  for (int g = 0; g < sh.G; ++g) {
    const float *qg = q + g * hd, *og = o + g * hd, *dog = dout + g * hd;
    scores(sh, qg, qr, kt, p);
    scores(sh, dog, qr, vt, ds);                    // dp = do v^T, over the same columns
    for (int t = 0; t < T; ++t) {
      vf acc = vf{};
      for (int h = 0; h < hd; h += kLanes) acc += load(dog + t * qr + h) * load(og + t * qr + h);
      softmax_grad_row(p + long(t) * ld, ds + long(t) * ld, allowed + long(t) * S, sh.keys(t), S, Sp, scale,
                       lse[g * T + t], hsum(acc));
    }
    // dq = ds k; dk += ds^T q and dv += p^T do, summed over the pair's G query heads.
    gemm(T, ds, ld, 1, k, kr, dq + g * hd, qr, false, [&](int, int i1) { return Span{0, sh.keys(i1 - 1), hd}; });
    gemm(S, ds, 1, ld, qg, qr, dk, kr, g > 0, rows_after);
    gemm(S, p, 1, ld, dog, qr, dv, kr, g > 0, rows_after);
  }
}

ffi::Error check_shapes(const ffi::Buffer<ffi::F32>& q, const ffi::Buffer<ffi::F32>& k,
                        const ffi::Buffer<ffi::F32>& v, const ffi::Buffer<ffi::U8>& allowed, int32_t causal,
                        Shape* sh) {
  auto qd = q.dimensions(), kd = k.dimensions(), vd = v.dimensions(), ad = allowed.dimensions();
  if (qd.size() != 5 || kd.size() != 4 || vd.size() != 4 || ad.size() != 3)
    return ffi::Error::InvalidArgument("rlkit attention: expected q of rank 5, k and v of rank 4, allowed of rank 3");
  *sh = Shape{qd[0], qd[1], kd[1], qd[2], qd[3], qd[4], causal != 0};
  bool ok = kd[0] == sh->B && kd[2] == sh->KV && kd[3] == sh->hd && vd[0] == kd[0] && vd[1] == kd[1] &&
            vd[2] == kd[2] && vd[3] == kd[3] && ad[0] == sh->B && ad[1] == sh->T && ad[2] == sh->S &&
            sh->hd % kLanes == 0 && (!sh->causal || sh->S == sh->T);
  if (!ok) return ffi::Error::InvalidArgument("rlkit attention: inconsistent shapes (see kernels/cpu/attention.cc)");
  return ffi::Error::Success();
}

// Offsets of pair i = (b, kv) in q-like and k-like arrays and in lse [B, KV, G, T].
struct Pair {
  long q, k, lse, b;
  Pair(const Shape& sh, int i)
      : q((i / sh.KV) * sh.T * sh.q_row() + (i % sh.KV) * sh.G * sh.hd),
        k((i / sh.KV) * sh.S * sh.k_row() + (i % sh.KV) * sh.hd),
        lse(long(i) * sh.G * sh.T),
        b((i / sh.KV) * sh.T * sh.S) {}
};

ffi::Error AttentionForward(ffi::ThreadPool pool, ffi::Buffer<ffi::F32> q, ffi::Buffer<ffi::F32> k,
                            ffi::Buffer<ffi::F32> v, ffi::Buffer<ffi::U8> allowed,
                            ffi::ResultBuffer<ffi::F32> o, ffi::ResultBuffer<ffi::F32> lse, int32_t causal) {
  Shape sh;
  if (auto err = check_shapes(q, k, v, allowed, causal, &sh); err.failure()) return err;
  parallel_for(pool, int(sh.B * sh.KV), [&](int i) {
    Pair at(sh, i);
    forward_pair(sh, q.typed_data() + at.q, k.typed_data() + at.k, v.typed_data() + at.k,
                 allowed.typed_data() + at.b, o->typed_data() + at.q, lse->typed_data() + at.lse);
  });
  return ffi::Error::Success();
}

ffi::Error AttentionBackward(ffi::ThreadPool pool, ffi::Buffer<ffi::F32> q, ffi::Buffer<ffi::F32> k,
                             ffi::Buffer<ffi::F32> v, ffi::Buffer<ffi::U8> allowed, ffi::Buffer<ffi::F32> o,
                             ffi::Buffer<ffi::F32> lse, ffi::Buffer<ffi::F32> dout,
                             ffi::ResultBuffer<ffi::F32> dq, ffi::ResultBuffer<ffi::F32> dk,
                             ffi::ResultBuffer<ffi::F32> dv, int32_t causal) {
  Shape sh;
  if (auto err = check_shapes(q, k, v, allowed, causal, &sh); err.failure()) return err;
  parallel_for(pool, int(sh.B * sh.KV), [&](int i) {
    Pair at(sh, i);
    backward_pair(sh, q.typed_data() + at.q, k.typed_data() + at.k, v.typed_data() + at.k,
                  allowed.typed_data() + at.b, o.typed_data() + at.q, lse.typed_data() + at.lse,
                  dout.typed_data() + at.q, dq->typed_data() + at.q, dk->typed_data() + at.k,
                  dv->typed_data() + at.k);
  });
  return ffi::Error::Success();
}

}  // namespace

XLA_FFI_DEFINE_HANDLER_SYMBOL(RlkitAttentionForward, AttentionForward,
                              ffi::Ffi::Bind()
                                  .Ctx<ffi::ThreadPool>()
                                  .Arg<ffi::Buffer<ffi::F32>>()
                                  .Arg<ffi::Buffer<ffi::F32>>()
                                  .Arg<ffi::Buffer<ffi::F32>>()
                                  .Arg<ffi::Buffer<ffi::U8>>()
                                  .Ret<ffi::Buffer<ffi::F32>>()
                                  .Ret<ffi::Buffer<ffi::F32>>()
                                  .Attr<int32_t>("causal"));

XLA_FFI_DEFINE_HANDLER_SYMBOL(RlkitAttentionBackward, AttentionBackward,
                              ffi::Ffi::Bind()
                                  .Ctx<ffi::ThreadPool>()
                                  .Arg<ffi::Buffer<ffi::F32>>()
                                  .Arg<ffi::Buffer<ffi::F32>>()
                                  .Arg<ffi::Buffer<ffi::F32>>()
                                  .Arg<ffi::Buffer<ffi::U8>>()
                                  .Arg<ffi::Buffer<ffi::F32>>()
                                  .Arg<ffi::Buffer<ffi::F32>>()
                                  .Arg<ffi::Buffer<ffi::F32>>()
                                  .Ret<ffi::Buffer<ffi::F32>>()
                                  .Ret<ffi::Buffer<ffi::F32>>()
                                  .Ret<ffi::Buffer<ffi::F32>>()
                                  .Attr<int32_t>("causal"));
