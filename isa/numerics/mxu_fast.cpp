// The fast MXU kernel: bit-identical to mxu_matmul_reference, vectorised over
// output columns with runtime dispatch (AVX-512, AVX2, portable C++).
//
// Why the vector paths give the reference's bits:
//  * Order: each vector lane is one output column, and the k loop inside a chunk
//    stays sequential, so every lane performs exactly the reference's sequence of
//    adds. K is blocked only at chunk boundaries (kc is a multiple of R), and the
//    chunk sums are folded into C in increasing chunk order.
//  * Rounding: products and adds are separate instructions (no FMA; the library is
//    built with -ffp-contract=off), each IEEE RNE.
//  * DAZ: operands are unpacked from bf16 as bf16_to_fp32 does (subnormal -> signed
//    zero, NaN -> canonical) while packing, so the kernel only sees normal values,
//    zeros, Inf and the canonical NaN. MXCSR.DAZ covers an accumulated C value.
//  * FTZ: MXCSR.FTZ flushes when x86 signals underflow, and x86 detects tininess
//    after rounding to 24 bits with unbounded exponent. The contract flushes
//    results that are subnormal after IEEE rounding. These differ only for an
//    exact result in (2^-126 - 2^-150, 2^-126) with more than 24 significant bits.
//    A sum of two normal fp32 values is a multiple of 2^-149, so whenever it is
//    below 2^-126 it is exact and both rules flush it. A product of two bf16
//    values has at most 16 significant bits, so below 2^-126 it is at most
//    2^-126 - 2^-142 and both rules flush it. So MXCSR gives the contract here
//    (and only here: a general fp32 multiply can differ, see docs/numerics.md).
//  * NaN: x86 writes 0xFFC00000 for an invalid operation and propagates payloads.
//    Every NaN is sticky through the remaining adds, so one pass over C at the end
//    that writes the canonical NaN gives what the reference's per-step rule gives.
#include <algorithm>
#include <cstdlib>
#include <cstring>
#include <memory>
#include <new>
#include <stdexcept>
#include <string>
#include <vector>

#include "isa/numerics/mxu_paths.h"

#if defined(__x86_64__) || defined(__i386__)
#define TPUSIM_MXU_X86 1
#include <immintrin.h>
#else
#define TPUSIM_MXU_X86 0
#endif

namespace tpusim::num {
namespace {

// Cache blocking. A packed W block (kc x nc fp32) stays in L2, one packed W
// micro-panel (kc x NR) in L1, and the packed A block (mc x kc) in L2.
constexpr int kKcTarget = 256;
constexpr int kNcTarget = 512;
constexpr int kMcTarget = 192;

// The driver (packing, blocking, the final NaN pass) is inlined into one wrapper
// per code path, each compiled for its ISA, so the packing loops vectorise as wide
// as the micro-kernel; packing is about half the time of a 128^3 matmul.
#define TPUSIM_DRIVER_INLINE inline __attribute__((always_inline))

// One micro-tile job: an MR x NR tile of C over one chunk-aligned K block.
struct TileJob {
  const float* a;    // packed A micro-panel: a[k * MR + r] (row-major A: a[r * lda + k])
  const float* w;    // packed W micro-panel: w[k * NR + j]
  float* c;          // the C tile (or a scratch tile for the ragged edges)
  size_t ldc;
  int kc;            // length of the K block, a multiple of R unless it ends K
  int rows;          // R
  bool overwrite_first;  // the block starts with chunk 0 of a non-accumulating matmul
  size_t lda = 0;        // row stride of an unpacked (row-major) A
  bool last_block = false;  // the block ends K: NaNs are made canonical as C is stored
};

using MicroKernel = void (*)(const TileJob&);

struct KernelSpec {
  int mr, nr;
  MicroKernel fn;
};

// Flush-to-zero without a branch, for the portable kernel: inputs there are
// already DAZ'd and NaN-canonical, so only subnormal results need handling, and a
// branch-free form lets the compiler vectorise with whatever the baseline ISA has.
inline float ftz(float x) {
  const uint32_t u = f32_bits(x);
  const uint32_t keep = (u & kF32ExpMask) != 0 ? 0xFFFFFFFFu : kF32SignMask;
  return f32_from_bits(u & keep);
}

// Portable micro-kernel: plain C++ with the contract's flushes written out. NaNs
// are canonicalised by the final pass, as in the vector paths.
template <int MR, int NR, bool kRowA = false>
void kernel_portable(const TileJob& t) {
  const size_t lda = kRowA ? t.lda : 1;
  for (int off = 0; off < t.kc; off += t.rows) {
    const int len = std::min(t.rows, t.kc - off);
    float s[MR][NR];
    for (int r = 0; r < MR; ++r)
      for (int j = 0; j < NR; ++j) s[r][j] = 0.0f;
    const float* a = kRowA ? t.a + off : t.a + static_cast<size_t>(off) * MR;
    const float* w = t.w + static_cast<size_t>(off) * NR;
    for (int k = 0; k < len; ++k, a += kRowA ? 1 : MR, w += NR)
      for (int r = 0; r < MR; ++r) {
        const float ar = kRowA ? a[r * lda] : a[r];
        for (int j = 0; j < NR; ++j) s[r][j] = ftz(s[r][j] + ftz(ar * w[j]));
      }
    const bool short_chunk = len < t.rows;
    const bool overwrite = off == 0 && t.overwrite_first;
    const bool canonical = kRowA && t.last_block && off + t.rows >= t.kc;
    for (int r = 0; r < MR; ++r) {
      float* c = t.c + r * t.ldc;
      for (int j = 0; j < NR; ++j) {
        const float v = short_chunk ? ftz(s[r][j] + 0.0f) : s[r][j];
        c[j] = overwrite ? v : ftz(ftz(c[j]) + v);
        if (canonical && c[j] != c[j]) c[j] = f32_from_bits(kCanonicalNanF32);
      }
    }
  }
}

#if TPUSIM_MXU_X86

// MXCSR for the vector paths: round to nearest, all exceptions masked, FTZ (bit
// 15) and DAZ (bit 6). The caller's MXCSR is restored on every exit.
class MxcsrGuard {
 public:
  MxcsrGuard() : saved_(_mm_getcsr()) { _mm_setcsr(0x1F80u | 0x8000u | 0x0040u); }
  ~MxcsrGuard() { _mm_setcsr(saved_); }
  MxcsrGuard(const MxcsrGuard&) = delete;
  MxcsrGuard& operator=(const MxcsrGuard&) = delete;

 private:
  unsigned saved_;
};

// AVX-512: MR rows x 32 columns (two zmm per row) of chunk sums in registers.
template <int MR, bool kRowA = false>
__attribute__((target("avx512f"))) void kernel_avx512(const TileJob& t) {
  constexpr int NR = 32;
  const size_t lda = kRowA ? t.lda : 1;
  for (int off = 0; off < t.kc; off += t.rows) {
    const int len = std::min(t.rows, t.kc - off);
    __m512 s0[MR], s1[MR];
#pragma GCC unroll 16
    for (int r = 0; r < MR; ++r) s0[r] = s1[r] = _mm512_setzero_ps();
    const float* a = kRowA ? t.a + off : t.a + static_cast<size_t>(off) * MR;
    const float* w = t.w + static_cast<size_t>(off) * NR;
    for (int k = 0; k < len; ++k, a += kRowA ? 1 : MR, w += NR) {
      const __m512 w0 = _mm512_load_ps(w);
      const __m512 w1 = _mm512_load_ps(w + 16);
#pragma GCC unroll 16
      for (int r = 0; r < MR; ++r) {
        const __m512 ar = _mm512_set1_ps(kRowA ? a[r * lda] : a[r]);
        s0[r] = _mm512_add_ps(s0[r], _mm512_mul_ps(ar, w0));
        s1[r] = _mm512_add_ps(s1[r], _mm512_mul_ps(ar, w1));
      }
    }
    if (len < t.rows) {  // the unused rows of a short last chunk add +0.0
      const __m512 zero = _mm512_setzero_ps();
#pragma GCC unroll 16
      for (int r = 0; r < MR; ++r) {
        s0[r] = _mm512_add_ps(s0[r], zero);
        s1[r] = _mm512_add_ps(s1[r], zero);
      }
    }
    const bool overwrite = off == 0 && t.overwrite_first;
    const bool canonical = kRowA && t.last_block && off + t.rows >= t.kc;
    const __m512 nan = _mm512_castsi512_ps(_mm512_set1_epi32(static_cast<int>(kCanonicalNanF32)));
#pragma GCC unroll 16
    for (int r = 0; r < MR; ++r) {
      float* c = t.c + r * t.ldc;
      if (!overwrite) {
        s0[r] = _mm512_add_ps(_mm512_loadu_ps(c), s0[r]);
        s1[r] = _mm512_add_ps(_mm512_loadu_ps(c + 16), s1[r]);
      }
      if (canonical) {
        s0[r] = _mm512_mask_mov_ps(s0[r], _mm512_cmp_ps_mask(s0[r], s0[r], _CMP_UNORD_Q), nan);
        s1[r] = _mm512_mask_mov_ps(s1[r], _mm512_cmp_ps_mask(s1[r], s1[r], _CMP_UNORD_Q), nan);
      }
      _mm512_storeu_ps(c, s0[r]);
      _mm512_storeu_ps(c + 16, s1[r]);
    }
  }
}

// AVX2 (no FMA needed): MR rows x 16 columns (two ymm per row).
template <int MR, bool kRowA = false>
__attribute__((target("avx2"))) void kernel_avx2(const TileJob& t) {
  constexpr int NR = 16;
  const size_t lda = kRowA ? t.lda : 1;
  for (int off = 0; off < t.kc; off += t.rows) {
    const int len = std::min(t.rows, t.kc - off);
    __m256 s0[MR], s1[MR];
#pragma GCC unroll 16
    for (int r = 0; r < MR; ++r) s0[r] = s1[r] = _mm256_setzero_ps();
    const float* a = kRowA ? t.a + off : t.a + static_cast<size_t>(off) * MR;
    const float* w = t.w + static_cast<size_t>(off) * NR;
    for (int k = 0; k < len; ++k, a += kRowA ? 1 : MR, w += NR) {
      const __m256 w0 = _mm256_load_ps(w);
      const __m256 w1 = _mm256_load_ps(w + 8);
#pragma GCC unroll 16
      for (int r = 0; r < MR; ++r) {
        const __m256 ar = _mm256_broadcast_ss(kRowA ? a + r * lda : a + r);
        s0[r] = _mm256_add_ps(s0[r], _mm256_mul_ps(ar, w0));
        s1[r] = _mm256_add_ps(s1[r], _mm256_mul_ps(ar, w1));
      }
    }
    if (len < t.rows) {
      const __m256 zero = _mm256_setzero_ps();
#pragma GCC unroll 16
      for (int r = 0; r < MR; ++r) {
        s0[r] = _mm256_add_ps(s0[r], zero);
        s1[r] = _mm256_add_ps(s1[r], zero);
      }
    }
    const bool overwrite = off == 0 && t.overwrite_first;
    const bool canonical = kRowA && t.last_block && off + t.rows >= t.kc;
    const __m256 nan = _mm256_castsi256_ps(_mm256_set1_epi32(static_cast<int>(kCanonicalNanF32)));
#pragma GCC unroll 16
    for (int r = 0; r < MR; ++r) {
      float* c = t.c + r * t.ldc;
      if (!overwrite) {
        s0[r] = _mm256_add_ps(_mm256_loadu_ps(c), s0[r]);
        s1[r] = _mm256_add_ps(_mm256_loadu_ps(c + 8), s1[r]);
      }
      if (canonical) {
        s0[r] = _mm256_blendv_ps(s0[r], nan, _mm256_cmp_ps(s0[r], s0[r], _CMP_UNORD_Q));
        s1[r] = _mm256_blendv_ps(s1[r], nan, _mm256_cmp_ps(s1[r], s1[r], _CMP_UNORD_Q));
      }
      _mm256_storeu_ps(c, s0[r]);
      _mm256_storeu_ps(c + 8, s1[r]);
    }
  }
}

#endif  // TPUSIM_MXU_X86

// 64-byte aligned scratch for the packed panels.
struct AlignedFree {
  void operator()(float* p) const { ::operator delete[](p, std::align_val_t{64}); }
};
using PackBuffer = std::unique_ptr<float[], AlignedFree>;

PackBuffer make_pack_buffer(size_t count) {
  return PackBuffer(static_cast<float*>(::operator new[](count * sizeof(float), std::align_val_t{64})));
}

// bf16_to_fp32 without branches, so that the packing loops vectorise: packing is
// most of the time of a small matmul.
TPUSIM_DRIVER_INLINE float unpack_bf16(uint16_t h) {
  uint32_t u = static_cast<uint32_t>(h) << 16;
  const uint32_t exp = u & kF32ExpMask;
  u = exp == 0 ? (u & kF32SignMask) : u;                                          // DAZ
  u = (exp == kF32ExpMask && (u & kF32FracMask) != 0) ? kCanonicalNanF32 : u;  // NaN
  return f32_from_bits(u);
}

// W[pc..pc+kc) x [jc..jc+nc) -> micro-panels of NR columns, k-major; columns past
// N are +0.0 (their results are never stored).
TPUSIM_DRIVER_INLINE void pack_w(const MatmulArgs& p, int pc, int kc, int jc, int nc, int nr, float* out) {
  for (int jr = 0; jr < nc; jr += nr) {
    const int cols = std::min(nr, nc - jr);
    for (int k = 0; k < kc; ++k) {
      const uint16_t* src = p.w + static_cast<size_t>(pc + k) * p.ldw + jc + jr;
      float* dst = out + static_cast<size_t>(jr) * kc + static_cast<size_t>(k) * nr;
      for (int j = 0; j < cols; ++j) dst[j] = unpack_bf16(src[j]);
      for (int j = cols; j < nr; ++j) dst[j] = 0.0f;
    }
  }
}

// A[ic..ic+mc) x [pc..pc+kc) -> micro-panels of MR rows, k-major; rows past M are
// +0.0.
TPUSIM_DRIVER_INLINE void pack_a(const MatmulArgs& p, int ic, int mc, int pc, int kc, int mr, float* out) {
  for (int ir = 0; ir < mc; ir += mr) {
    float* panel = out + static_cast<size_t>(ir) * kc;
    for (int r = 0; r < mr; ++r) {
      if (ir + r < mc) {
        const uint16_t* src = p.a + static_cast<size_t>(ic + ir + r) * p.lda + pc;
        for (int k = 0; k < kc; ++k) panel[static_cast<size_t>(k) * mr + r] = unpack_bf16(src[k]);
      } else {
        for (int k = 0; k < kc; ++k) panel[static_cast<size_t>(k) * mr + r] = 0.0f;
      }
    }
  }
}

TPUSIM_DRIVER_INLINE void run_blocked(const MatmulArgs& p, const KernelSpec& ks) {
  const int mr = ks.mr, nr = ks.nr;
  // kc: whole chunks only, so that a chunk sum never spans two K blocks.
  const int kc_max = p.rows <= kKcTarget ? (kKcTarget / p.rows) * p.rows : p.rows;
  const int nc_max = std::max(nr, (kNcTarget / nr) * nr);
  const int mc_max = std::max(mr, (kMcTarget / mr) * mr);
  const int kc_alloc = std::min(kc_max, p.k);
  const int nc_alloc = std::min(nc_max, (p.n + nr - 1) / nr * nr);
  const int mc_alloc = std::min(mc_max, (p.m + mr - 1) / mr * mr);
  PackBuffer wpack = make_pack_buffer(static_cast<size_t>(kc_alloc) * nc_alloc);
  PackBuffer apack = make_pack_buffer(static_cast<size_t>(kc_alloc) * mc_alloc);
  PackBuffer edge = make_pack_buffer(static_cast<size_t>(mr) * nr);

  for (int jc = 0; jc < p.n; jc += nc_max) {
    const int nc = std::min(nc_max, p.n - jc);
    for (int pc = 0; pc < p.k; pc += kc_max) {
      const int kc = std::min(kc_max, p.k - pc);
      pack_w(p, pc, kc, jc, nc, nr, wpack.get());
      const bool overwrite_first = !p.accumulate && pc == 0;
      for (int ic = 0; ic < p.m; ic += mc_max) {
        const int mc = std::min(mc_max, p.m - ic);
        pack_a(p, ic, mc, pc, kc, mr, apack.get());
        for (int jr = 0; jr < nc; jr += nr) {
          const int cols = std::min(nr, nc - jr);
          for (int ir = 0; ir < mc; ir += mr) {
            const int rows = std::min(mr, mc - ir);
            float* c = p.c + static_cast<size_t>(ic + ir) * p.ldc + jc + jr;
            TileJob t{apack.get() + static_cast<size_t>(ir) * kc, wpack.get() + static_cast<size_t>(jr) * kc,
                      c, p.ldc, kc, p.rows, overwrite_first};
            if (rows == mr && cols == nr) {
              ks.fn(t);
              continue;
            }
            // Ragged edge: run the tile on scratch so nothing outside C is touched.
            float* e = edge.get();
            std::fill(e, e + mr * nr, 0.0f);
            if (!overwrite_first)
              for (int r = 0; r < rows; ++r) std::memcpy(e + r * nr, c + r * p.ldc, cols * sizeof(float));
            t.c = e;
            t.ldc = nr;
            ks.fn(t);
            for (int r = 0; r < rows; ++r) std::memcpy(c + r * p.ldc, e + r * nr, cols * sizeof(float));
          }
        }
      }
    }
  }
}

// Branch-free so that it vectorises: rewriting a non-NaN with itself is harmless.
TPUSIM_DRIVER_INLINE void canonicalize_nans(const MatmulArgs& p) {
  for (int i = 0; i < p.m; ++i) {
    float* c = p.c + static_cast<size_t>(i) * p.ldc;
    for (int j = 0; j < p.n; ++j) {
      const uint32_t u = f32_bits(c[j]);
      c[j] = f32_from_bits(f32_is_nan(u) ? kCanonicalNanF32 : u);
    }
  }
}

// The packed-weights driver: W was packed once (all of K, NR-column micro-panels,
// k-major, so the K block starting at pc is the panel's rows [pc, pc + kc)), A is
// read in place (row-major fp32 operands), and NaNs are made canonical as the
// last K block is stored. Same tiles, same chunk order as run_blocked.
struct PackedView {
  const float* w;
  int k, n, rows;
};

TPUSIM_DRIVER_INLINE void run_prepacked(const PackedView& pw, const float* a, size_t lda, float* c, size_t ldc,
                                        int m, bool accumulate, const KernelSpec& ks) {
  const int mr = ks.mr, nr = ks.nr;
  const int kc_max = pw.rows <= kKcTarget ? (kKcTarget / pw.rows) * pw.rows : pw.rows;
  alignas(64) float edge_c[8 * 32];  // the widest tile (AVX-512: 8 x 32)
  std::vector<float> edge_a;         // a short last row block, zero-padded to MR rows
  for (int pc = 0; pc < pw.k; pc += kc_max) {
    const int kc = std::min(kc_max, pw.k - pc);
    const bool overwrite_first = !accumulate && pc == 0;
    const bool last_block = pc + kc >= pw.k;
    for (int jr = 0; jr < pw.n; jr += nr) {
      const int cols = std::min(nr, pw.n - jr);
      const float* wp = pw.w + static_cast<size_t>(jr) * pw.k + static_cast<size_t>(pc) * nr;
      for (int ir = 0; ir < m; ir += mr) {
        const int rows = std::min(mr, m - ir);
        float* ct = c + static_cast<size_t>(ir) * ldc + jr;
        TileJob t{a + static_cast<size_t>(ir) * lda + pc, wp, ct, ldc, kc, pw.rows, overwrite_first, lda, last_block};
        if (rows == mr && cols == nr) {
          ks.fn(t);
          continue;
        }
        if (rows < mr) {
          edge_a.assign(static_cast<size_t>(mr) * kc, 0.0f);
          for (int r = 0; r < rows; ++r)
            std::memcpy(&edge_a[static_cast<size_t>(r) * kc], t.a + static_cast<size_t>(r) * lda, kc * sizeof(float));
          t.a = edge_a.data();
          t.lda = static_cast<size_t>(kc);
        }
        std::fill(edge_c, edge_c + mr * nr, 0.0f);
        if (!overwrite_first)
          for (int r = 0; r < rows; ++r) std::memcpy(edge_c + r * nr, ct + r * ldc, cols * sizeof(float));
        t.c = edge_c;
        t.ldc = nr;
        ks.fn(t);
        for (int r = 0; r < rows; ++r) std::memcpy(ct + r * ldc, edge_c + r * nr, cols * sizeof(float));
      }
    }
  }
}

void pack_portable(const MatmulArgs& p, float* out) { pack_w(p, 0, p.k, 0, p.n, 16, out); }

void run_packed_portable(const PackedView& w, const float* a, size_t lda, float* c, size_t ldc, int m, bool acc) {
  run_prepacked(w, a, lda, c, ldc, m, acc, KernelSpec{4, 16, &kernel_portable<4, 16, true>});
}

void run_portable(const MatmulArgs& p) {
  run_blocked(p, KernelSpec{4, 16, &kernel_portable<4, 16>});
  canonicalize_nans(p);
}

#if TPUSIM_MXU_X86
__attribute__((target("avx2"))) void run_avx2(const MatmulArgs& p) {
  MxcsrGuard mxcsr;
  run_blocked(p, KernelSpec{6, 16, &kernel_avx2<6>});
  canonicalize_nans(p);
}

__attribute__((target("avx512f"))) void run_avx512(const MatmulArgs& p) {
  MxcsrGuard mxcsr;
  run_blocked(p, KernelSpec{8, 32, &kernel_avx512<8>});
  canonicalize_nans(p);
}

__attribute__((target("avx2"))) void pack_avx2(const MatmulArgs& p, float* out) { pack_w(p, 0, p.k, 0, p.n, 16, out); }

__attribute__((target("avx512f"))) void pack_avx512(const MatmulArgs& p, float* out) {
  pack_w(p, 0, p.k, 0, p.n, 32, out);
}

__attribute__((target("avx2"))) void run_packed_avx2(const PackedView& w, const float* a, size_t lda, float* c,
                                                     size_t ldc, int m, bool acc) {
  MxcsrGuard mxcsr;
  run_prepacked(w, a, lda, c, ldc, m, acc, KernelSpec{6, 16, &kernel_avx2<6, true>});
}

__attribute__((target("avx512f"))) void run_packed_avx512(const PackedView& w, const float* a, size_t lda, float* c,
                                                         size_t ldc, int m, bool acc) {
  MxcsrGuard mxcsr;
  run_prepacked(w, a, lda, c, ldc, m, acc, KernelSpec{8, 32, &kernel_avx512<8, true>});
}
#endif

int panel_width(MxuPath path) { return path == MxuPath::kAvx512 ? 32 : 16; }

bool cpu_has(MxuPath path) {
#if TPUSIM_MXU_X86
  switch (path) {
    case MxuPath::kPortable: return true;
    case MxuPath::kAvx2: return __builtin_cpu_supports("avx2");
    case MxuPath::kAvx512: return __builtin_cpu_supports("avx512f");
  }
  return false;
#else
  return path == MxuPath::kPortable;
#endif
}

}  // namespace

const char* mxu_path_name(MxuPath path) {
  switch (path) {
    case MxuPath::kPortable: return "portable";
    case MxuPath::kAvx2: return "avx2";
    case MxuPath::kAvx512: return "avx512";
  }
  return "unknown";
}

bool mxu_path_supported(MxuPath path) { return cpu_has(path); }

MxuPath mxu_selected_path() {
  static const MxuPath selected = [] {
    if (cpu_has(MxuPath::kAvx512)) return MxuPath::kAvx512;
    if (cpu_has(MxuPath::kAvx2)) return MxuPath::kAvx2;
    return MxuPath::kPortable;
  }();
  return selected;
}

void mxu_matmul_with(MxuPath path, const MatmulArgs& p) {
  if (!mxu_path_supported(path))
    throw std::invalid_argument(std::string("mxu_matmul: code path '") + mxu_path_name(path) +
                                "' is not supported on this CPU");
  mxu_validate_args(p);
  if (p.m == 0 || p.n == 0) return;
  if (p.k == 0) {  // no chunks: the result is the (flushed) accumulator or +0.0
    for (int i = 0; i < p.m; ++i)
      for (int j = 0; j < p.n; ++j) {
        float& c = p.c[static_cast<size_t>(i) * p.ldc + j];
        c = p.accumulate ? flush(c) : 0.0f;
      }
    return;
  }
  switch (path) {
    case MxuPath::kPortable:
      run_portable(p);
      return;
#if TPUSIM_MXU_X86
    case MxuPath::kAvx2:
      run_avx2(p);
      return;
    case MxuPath::kAvx512:
      run_avx512(p);
      return;
#else
    default: break;
#endif
  }
}

void mxu_matmul(const MatmulArgs& args) { mxu_matmul_with(mxu_selected_path(), args); }

__attribute__((target_clones("avx512f", "avx2", "default"))) void mxu_round_lhs(const uint32_t* src, float* dst,
                                                                                size_t n) {
  // round_to_bf16 without branches: a normal value rounds to a normal bf16 (or
  // Inf), so the conversion back is exact and only zeros and NaNs need a rule.
  for (size_t j = 0; j < n; ++j) {
    const uint32_t u = src[j];
    const uint32_t mag = u & 0x7FFFFFFFu;
    const uint32_t rounded = ((u + 0x7FFFu + ((u >> 16) & 1u)) >> 16) << 16;
    uint32_t r = mag < 0x00800000u ? (u & kF32SignMask) : rounded;  // subnormal: signed zero
    r = mag > 0x7F800000u ? kCanonicalNanF32 : r;
    dst[j] = f32_from_bits(r);
  }
}

void MxuPackedWeights::pack(const uint16_t* w, size_t ldw, int k, int n, int rows) {
  mxu_pack_weights_with(mxu_selected_path(), *this, w, ldw, k, n, rows);
}

const float* MxuPackedWeights::data() const {
  const auto at = reinterpret_cast<uintptr_t>(storage_.data());
  return storage_.data() + ((64 - at % 64) % 64) / sizeof(float);
}

void mxu_pack_weights_with(MxuPath path, MxuPackedWeights& out, const uint16_t* w, size_t ldw, int k, int n,
                           int rows) {
  if (!mxu_path_supported(path))
    throw std::invalid_argument(std::string("mxu_pack_weights: code path '") + mxu_path_name(path) +
                                "' is not supported on this CPU");
  MatmulArgs p;
  p.w = w;
  p.ldw = ldw;
  p.k = k;
  p.n = n;
  p.rows = rows;
  p.lda = static_cast<size_t>(k);
  p.ldc = static_cast<size_t>(n);
  p.a = w;
  p.c = reinterpret_cast<float*>(&out);  // non-null: only W is validated here
  p.m = 0;
  mxu_validate_args(p);
  const int nr = panel_width(path);
  const size_t panels = static_cast<size_t>((n + nr - 1) / nr);
  out.path_ = static_cast<int>(path);
  out.k_ = k;
  out.n_ = n;
  out.rows_ = rows;
  out.storage_.assign(panels * nr * static_cast<size_t>(k) + 64 / sizeof(float), 0.0f);
  if (k == 0 || n == 0) return;
  float* dst = const_cast<float*>(out.data());
  switch (path) {
    case MxuPath::kPortable: pack_portable(p, dst); return;
#if TPUSIM_MXU_X86
    case MxuPath::kAvx2: pack_avx2(p, dst); return;
    case MxuPath::kAvx512: pack_avx512(p, dst); return;
#else
    default: break;
#endif
  }
}

void mxu_matmul_packed(const MxuPackedWeights& w, const float* a, size_t lda, float* c, size_t ldc, int m,
                       bool accumulate) {
  if (m < 0) throw std::invalid_argument("mxu_matmul_packed: m < 0");
  if (w.n() > 0 && ldc < static_cast<size_t>(w.n())) throw std::invalid_argument("mxu_matmul_packed: ldc < n");
  if (w.k() > 0 && lda < static_cast<size_t>(w.k())) throw std::invalid_argument("mxu_matmul_packed: lda < k");
  if (m == 0 || w.n() == 0) return;
  if (w.k() == 0) {  // no chunks: the (flushed) accumulator or +0.0
    for (int i = 0; i < m; ++i)
      for (int j = 0; j < w.n(); ++j) {
        float& x = c[static_cast<size_t>(i) * ldc + j];
        x = accumulate ? flush(x) : 0.0f;
      }
    return;
  }
  const PackedView view{w.data(), w.k(), w.n(), w.rows()};
  switch (static_cast<MxuPath>(w.path_)) {
    case MxuPath::kPortable: run_packed_portable(view, a, lda, c, ldc, m, accumulate); return;
#if TPUSIM_MXU_X86
    case MxuPath::kAvx2: run_packed_avx2(view, a, lda, c, ldc, m, accumulate); return;
    case MxuPath::kAvx512: run_packed_avx512(view, a, lda, c, ldc, m, accumulate); return;
#else
    default: break;
#endif
  }
}

const char* mxu_matmul_isa() { return mxu_path_name(mxu_selected_path()); }

}  // namespace tpusim::num
