// What a compiler would emit for an M x K x N matmul on one MXU, and the
// independent expectation to hold its results against. Shared by the MXU tests.
//
// Tiles: N in C-column tiles, K in R-row chunks. For each weight tile the pushes
// (mpush rows, or mpush.t columns), mswap k=<rows in the chunk>, then one mmul per
// 8 rows of M; the next tile's pushes are interleaved with this tile's mmuls
// (double buffering), and each mmul's mpop (mpop.add after the first K chunk)
// trails it by `pop_lag` mmuls. Lanes and sublanes outside the problem carry
// garbage (NaN, Inf, huge values), which the MXU must ignore: padding rows of M
// and columns of N land in result lanes nobody reads, and reduction lanes past K
// are invalid weight rows that contribute +0.0.
#pragma once

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <limits>
#include <random>
#include <vector>

#include "hw/mxu/mxu_queue.h"
#include "isa/numerics/bf16.h"
#include "isa/numerics/mxu.h"

namespace tpusim::hw::mxu::testing {

struct MatmulProblem {
  int m = 0, k = 0, n = 0;
  std::vector<float> a;  // m x k
  std::vector<float> w;  // k x n
};

struct PopTarget {
  int mt = 0, nt = 0;  // which 8-row group of M, which C-column tile of N
  bool accumulate = false;
};

struct Program {
  std::vector<MxuOp> ops;
  std::vector<PopTarget> pops;  // by pop tag
};

inline float garbage(std::mt19937& rng) {
  const float g[] = {std::numeric_limits<float>::quiet_NaN(), std::numeric_limits<float>::infinity(),
                     -std::numeric_limits<float>::infinity(), 3.0e38f, -7.5f};
  return g[rng() % 5];
}

// Mostly ordinary values, with signed zeros, subnormals, huge and tiny values and
// (rarely, so that most results stay finite) Inf and NaN.
inline float mixed_value(std::mt19937& rng, bool specials) {
  std::uniform_real_distribution<float> u(-4.0f, 4.0f);
  const int pick = static_cast<int>(rng() % 1000);
  if (!specials || pick >= 100) return u(rng) * std::ldexp(1.0f, static_cast<int>(rng() % 9) - 4);
  if (pick < 30) return 0.0f;
  if (pick < 60) return -0.0f;
  if (pick < 70) return std::ldexp(1.0f, -130) * (pick % 2 ? 1.0f : -1.0f);  // subnormal: read as signed zero
  if (pick < 80) return 1.0e30f * u(rng);                                   // products overflow to Inf
  if (pick < 90) return 1.0e-25f * u(rng);                                  // products flush to zero
  if (pick < 95) return pick % 2 ? std::numeric_limits<float>::infinity() : -std::numeric_limits<float>::infinity();
  return std::numeric_limits<float>::quiet_NaN();
}

inline MatmulProblem random_problem(int m, int k, int n, uint32_t seed, bool specials) {
  std::mt19937 rng(seed);
  MatmulProblem p{m, k, n, {}, {}};
  p.a.resize(static_cast<size_t>(m) * k);
  p.w.resize(static_cast<size_t>(k) * n);
  for (auto& x : p.a) x = mixed_value(rng, specials);
  for (auto& x : p.w) x = mixed_value(rng, specials);
  return p;
}

inline int ceil_div(int a, int b) { return (a + b - 1) / b; }

inline Program compile_matmul(const MatmulProblem& p, const MxuParams& hw, bool transposed_push, int pop_lag,
                              uint32_t seed) {
  std::mt19937 rng(seed);
  const int R = hw.rows, C = hw.cols;
  const int mtiles = ceil_div(p.m, kSublanes), ktiles = ceil_div(p.k, R), ntiles = ceil_div(p.n, C);
  Program prog;
  uint64_t next_tag = 1u << 20;
  auto push_ops = [&](int kt, int nt) {
    std::vector<MxuOp> ops;
    const int rows = std::min(R, p.k - kt * R), cols = std::min(C, p.n - nt * C);
    const int vregs = transposed_push ? ceil_div(cols, kSublanes) : ceil_div(rows, kSublanes);
    for (int j = 0; j < vregs; ++j) {
      MxuOp op;
      op.kind = transposed_push ? MxuOpKind::kPushTransposed : MxuOpKind::kPush;
      op.tag = next_tag++;
      for (int s = 0; s < kSublanes; ++s)
        for (int l = 0; l < kLanes; ++l) {
          // normal: sublane = row k, lane = column n; transposed: sublane = column, lane = row
          const int kk = transposed_push ? l : j * kSublanes + s;
          const int nn = transposed_push ? j * kSublanes + s : l;
          const bool in = kk < rows && nn < cols && kk < R && nn < C;
          op.data.at(s, l) = in ? p.w[static_cast<size_t>(kt * R + kk) * p.n + static_cast<size_t>(nt * C + nn)]
                                : garbage(rng);
        }
      ops.push_back(op);
    }
    MxuOp swap;
    swap.kind = MxuOpKind::kSwap;
    swap.valid_rows = rows;
    swap.tag = next_tag++;
    ops.push_back(swap);
    return ops;
  };
  std::vector<std::pair<int, int>> tiles;
  for (int nt = 0; nt < ntiles; ++nt)
    for (int kt = 0; kt < ktiles; ++kt) tiles.emplace_back(kt, nt);
  std::vector<PopTarget> outstanding;
  auto emit_pop = [&]() {
    MxuOp pop;
    pop.kind = outstanding.front().accumulate ? MxuOpKind::kPopAdd : MxuOpKind::kPop;
    pop.tag = prog.pops.size();
    prog.pops.push_back(outstanding.front());
    outstanding.erase(outstanding.begin());
    prog.ops.push_back(pop);
  };
  if (tiles.empty()) return prog;
  std::vector<MxuOp> next = push_ops(tiles[0].first, tiles[0].second);
  for (auto& op : next) prog.ops.push_back(op);
  for (size_t t = 0; t < tiles.size(); ++t) {
    const int kt = tiles[t].first, nt = tiles[t].second;
    next = t + 1 < tiles.size() ? push_ops(tiles[t + 1].first, tiles[t + 1].second) : std::vector<MxuOp>{};
    const size_t pushes = next.empty() ? 0 : next.size() - 1;  // the swap waits for this tile's mmuls
    const int rows = std::min(R, p.k - kt * R);
    for (int i = 0; i < std::max<int>(mtiles, static_cast<int>(pushes)); ++i) {
      if (i < mtiles) {
        MxuOp mm;
        mm.kind = MxuOpKind::kMatmul;
        mm.tag = next_tag++;
        for (int s = 0; s < kSublanes; ++s)
          for (int l = 0; l < kLanes; ++l) {
            const int row = i * kSublanes + s;
            mm.data.at(s, l) = row < p.m && l < rows ? p.a[static_cast<size_t>(row) * p.k + static_cast<size_t>(kt * R + l)]
                                                     : garbage(rng);
          }
        prog.ops.push_back(mm);
        outstanding.push_back({i, nt, kt > 0});
        if (static_cast<int>(outstanding.size()) > pop_lag) emit_pop();
      }
      if (static_cast<size_t>(i) < pushes) prog.ops.push_back(next[static_cast<size_t>(i)]);
    }
    if (!next.empty()) prog.ops.push_back(next.back());
  }
  while (!outstanding.empty()) emit_pop();
  return prog;
}

// The M x N result assembled from the pops as the vector unit would: mpop writes
// the tile, mpop.add adds into it.
class ResultAssembler {
 public:
  ResultAssembler(const MatmulProblem& p, const MxuParams& hw, const Program& prog)
      : p_(p), hw_(hw), prog_(prog),
        tiles_(static_cast<size_t>(ceil_div(p.m, kSublanes)) * static_cast<size_t>(ceil_div(p.n, hw.cols))) {}
  void take(const PoppedVreg& v) {
    const PopTarget& t = prog_.pops.at(v.tag);
    Vreg& vd = tiles_[static_cast<size_t>(t.mt * ceil_div(p_.n, hw_.cols) + t.nt)];
    if (t.accumulate != v.accumulate) ++mismatched_kinds_;
    if (v.accumulate)
      add_into(vd, v.data);
    else
      vd = v.data;
  }
  std::vector<float> result() const {
    std::vector<float> c(static_cast<size_t>(p_.m) * p_.n);
    for (int i = 0; i < p_.m; ++i)
      for (int j = 0; j < p_.n; ++j)
        c[static_cast<size_t>(i) * p_.n + j] =
            tiles_[static_cast<size_t>((i / kSublanes) * ceil_div(p_.n, hw_.cols) + j / hw_.cols)].at(i % kSublanes,
                                                                                                   j % hw_.cols);
    return c;
  }
  int mismatched_kinds() const { return mismatched_kinds_; }

 private:
  const MatmulProblem& p_;
  MxuParams hw_;
  const Program& prog_;
  std::vector<Vreg> tiles_;
  int mismatched_kinds_ = 0;
};

// num::mxu_matmul_reference on the operands rounded to bf16 (as the MXU rounds them on entry).
inline std::vector<float> reference_result(const MatmulProblem& p, int rows) {
  std::vector<uint16_t> a(p.a.size()), w(p.w.size());
  std::transform(p.a.begin(), p.a.end(), a.begin(), num::fp32_to_bf16);
  std::transform(p.w.begin(), p.w.end(), w.begin(), num::fp32_to_bf16);
  std::vector<float> c(static_cast<size_t>(p.m) * p.n, 0.0f);
  num::MatmulArgs args;
  args.a = a.data();
  args.lda = static_cast<size_t>(std::max(1, p.k));
  args.w = w.data();
  args.ldw = static_cast<size_t>(std::max(1, p.n));
  args.c = c.data();
  args.ldc = static_cast<size_t>(std::max(1, p.n));
  args.m = p.m;
  args.k = p.k;
  args.n = p.n;
  args.rows = rows;
  num::mxu_matmul_reference(args);
  return c;
}

// The contract written out once more, independently of isa/numerics' matmul code:
// each product of bf16-rounded operands rounded to fp32, chunks of R from +0.0,
// the unused rows of a short chunk as +0.0 products, chunk sums added in order.
inline std::vector<float> explicit_result(const MatmulProblem& p, int rows) {
  std::vector<float> c(static_cast<size_t>(p.m) * p.n);
  for (int i = 0; i < p.m; ++i)
    for (int j = 0; j < p.n; ++j) {
      float acc = 0.0f;
      for (int k0 = 0; k0 < p.k; k0 += rows) {
        float s = 0.0f;
        for (int k = k0; k < k0 + rows; ++k) {
          const float prod =
              k < p.k ? num::mul(num::round_to_bf16(p.a[static_cast<size_t>(i) * p.k + k]),
                                 num::round_to_bf16(p.w[static_cast<size_t>(k) * p.n + j]))
                      : 0.0f;
          s = num::add(s, prod);
        }
        acc = k0 == 0 ? s : num::add(acc, s);
      }
      c[static_cast<size_t>(i) * p.n + j] = acc;
    }
  return c;
}

}  // namespace tpusim::hw::mxu::testing
