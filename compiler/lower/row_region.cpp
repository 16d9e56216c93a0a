// Row regions: a small subgraph of reductions (over the innermost axes, or down the
// rows of a 2-D value) and the elementwise ops around them lowered as one kernel on
// one core whose values all stay in VMEM: a softmax cross-entropy (max, shift, exp,
// sum, log, the loss's product and total, the softmax, the residual, the mean), a
// bias's gradient and its momentum update. Each of those ops was a kernel of its
// own, an HBM round trip of a few hundred bytes: two DMA latencies (~480 and ~420
// cycles, architecture.md) around a few vector instructions; the MLP step's eight
// xent kernels were 8.8 K of its 30 K cycles at batch 8 (docs/codegen.md "Fusion",
// row regions).
#include "compiler/lower/emitter.h"

#include <algorithm>
#include <cmath>
#include <cstring>
#include <functional>
#include <optional>

#include "isa/numerics/bf16.h"

namespace tpusim::compiler::lowering {

namespace {

// A region value at most this many elements, and its VMEM at most a quarter of VMEM:
// the kernel runs on one core, which is fast only while the values are small.
constexpr int64_t kRegionElems = 65536;

bool region_elementwise(const Node& n) {
  switch (n.op) {
    case OpKind::kAdd: case OpKind::kSub: case OpKind::kMul: case OpKind::kDiv: case OpKind::kRelu:
    case OpKind::kReluGrad: case OpKind::kTanh: case OpKind::kExp: case OpKind::kLog: case OpKind::kSqrt:
    case OpKind::kRsqrt: case OpKind::kErf: case OpKind::kNeg: case OpKind::kSigmoid: case OpKind::kGelu:
    case OpKind::kClip: case OpKind::kIdentity: case OpKind::kCast: return true;  // a cast rounds as vst.bf16 stores
    default: return false;
  }
}

bool reduces(const Node& n) {
  return n.op == OpKind::kReduceSum || n.op == OpKind::kReduceMax || n.op == OpKind::kReduceMean;
}

// A reduction over the innermost axes (a0..rank-1, in order: each row of its view is
// contiguous) of an operand of `rank` axes.
bool row_reduction(const Node& n, size_t rank) {
  if (!reduces(n)) return false;
  const auto& axes = n.attr_ints("axes");
  if (axes.empty() || axes.back() != static_cast<int64_t>(rank) - 1) return false;
  for (size_t i = 1; i < axes.size(); ++i)
    if (axes[i] != axes[i - 1] + 1) return false;
  return true;
}

// A sum, max or mean down the rows of a 2-D value (a bias's gradient): lower_columns's.
bool column_reduction(const Node& n, size_t rank) {
  return reduces(n) && rank == 2 && n.attr_ints("axes") == std::vector<int64_t>{0};
}

// A constant whose elements all load as the same value (fp32 bits as they are, bf16
// widened: DAZ): that value, broadcast into a register by `vbcast` instead of loaded.
// A scalar, and the training step's learning-rate and momentum rows and its first
// step's zero velocities.
std::optional<float> uniform_value(const Graph& g, const std::string& t) {
  const Constant* c = g.find_constant(t);
  if (!c || c->type.dtype == DType::kI64 || c->f.empty()) return std::nullopt;
  auto loaded = [&](float x) {
    const float y = c->type.dtype == DType::kBf16 ? num::bf16_to_fp32(num::fp32_to_bf16(x)) : x;
    uint32_t u;
    std::memcpy(&u, &y, 4);
    return u;
  };
  const uint32_t first = loaded(c->f[0]);
  for (float x : c->f)
    if (loaded(x) != first) return std::nullopt;
  float v;
  std::memcpy(&v, &first, 4);
  return v;
}

}  // namespace

// The row view of a region value: `rows` rows of `len` contiguous elements. A
// reduction's result has len 1 and is kept as broadcast tiles (its row value in every
// lane of its sublane, as vreduce.lanes leaves it, 8 rows a 4 KiB tile); any other
// value has its HBM layout (rows of the innermost axis, contiguous).
Emitter::RegionValue Emitter::region_view(const TensorType& t, bool bcast) {
  RegionValue v;
  v.dt = t.dtype;
  v.e = t.dtype == DType::kBf16 ? 2 : 4;
  const int64_t elems = num_elements(t.shape);
  v.kind = bcast ? RegionValue::kBcast : RegionValue::kRows;
  v.len = bcast || t.shape.empty() ? 1 : t.shape.back();
  v.rows = elems / std::max<int64_t>(v.len, 1);
  return v;
}

// Which nodes form row regions. A candidate is an fp32 or bf16 reduction (sum, max,
// mean) over the innermost axes or down the rows of a 2-D value, or an elementwise op
// the recipes lower, of at most kRegionElems elements. Each operand is a region
// value or comes from outside:
//  - rows of the result's elements (a region value, or an operand loaded whole: its
//    shape is the result's but for leading axes of one);
//  - a row reduction's result over the result's rows (its shape is the result's with
//    the last axis 1), from inside the region;
//  - a constant of one value (uniform_value: broadcast into a register);
//  - for a result that is a row value, a row value of as many elements.
// A reduction's operand is rows (a row reduction's view is then outer x reduced
// axes). Candidates that fail are dropped until none does, and so are those of a
// connected set that read an operand from outside made after the set's first node
// (where the kernel runs); sets whose values fit then merge horizontally (below).
void Emitter::plan_row_regions() {
  regions_.clear();
  region_of_.clear();
  region_exports_.clear();
  const size_t N = g_.nodes.size();
  std::map<std::string, size_t> producer;
  std::map<std::string, int> uses;
  for (size_t k = 0; k < N; ++k) {
    producer[g_.nodes[k].output] = k;
    for (const std::string& s : g_.nodes[k].inputs) ++uses[s];
  }
  std::set<std::string> outputs(g_.outputs.begin(), g_.outputs.end());
  auto floating = [&](const std::string& t) {  // fp32 or bf16 (the bf16 policy's), stored as such in VMEM
    return t_.at(t).type.dtype == DType::kF32 || t_.at(t).type.dtype == DType::kBf16;
  };
  auto rank_of = [&](const Node& n) { return n.inputs.empty() ? size_t{0} : t_.at(n.inputs[0]).type.shape.size(); };
  auto reduction = [&](const Node& n) { return row_reduction(n, rank_of(n)); };
  auto column = [&](const Node& n) { return column_reduction(n, rank_of(n)); };
  std::vector<bool> cand(N, false);
  for (size_t k = 0; k < N; ++k) {
    const Node& n = g_.nodes[k];
    if (!(reduction(n) || column(n) || region_elementwise(n)) || !floating(n.output)) continue;
    bool ok = true;
    for (const std::string& in : n.inputs)
      ok = ok && floating(in) && num_elements(t_.at(in).type.shape) <= kRegionElems;
    cand[k] = ok && num_elements(n.type.shape) <= kRegionElems;
  }
  // Asked of every operand on every pass: each constant's elements are looked at once.
  std::map<std::string, bool> uniform;
  auto scalar_const = [&](const std::string& t) {
    auto it = uniform.find(t);
    if (it == uniform.end()) it = uniform.emplace(t, uniform_value(g_, t).has_value()).first;
    return it->second;
  };
  auto inside = [&](const std::string& t) {
    auto p = producer.find(t);
    return p != producer.end() && cand[p->second];
  };
  // Whether elementwise node n makes row values: its operands are, or constants (one
  // of them a row value).
  auto row_values = [&](const Node& n) {
    bool row = false;
    for (const std::string& in : n.inputs) {
      const bool r = inside(in) && region_kind(in) == RegionValue::kBcast;
      if (!r && !scalar_const(in)) return false;
      row = row || r;
    }
    return row;
  };
  // Whether node k's operands relate to its result as the kernel can compute them.
  auto operands_ok = [&](size_t k) {
    const Node& n = g_.nodes[k];
    if (reduction(n) || column(n)) {
      const std::string& x = n.inputs[0];
      return !scalar_const(x) && (!inside(x) || region_kind(x) == RegionValue::kRows);
    }
    const Shape& out = n.type.shape;
    const bool out_bcast = row_values(n);
    for (const std::string& in : n.inputs) {
      const Shape& s = t_.at(in).type.shape;
      if (scalar_const(in)) continue;
      if (!inside(in)) {
        // Loaded whole, as rows: of the result's elements (then its shape is the result's
        // but for leading axes of one, so its bytes are in the same order).
        if (num_elements(s) != num_elements(out) || out_bcast) return false;
        continue;
      }
      if (region_kind(in) == RegionValue::kRows) {
        if (num_elements(s) != num_elements(out)) return false;
      } else if (out_bcast) {
        if (num_elements(s) != num_elements(out)) return false;
      } else {
        // A row value over rows: the result's shape with its last axis 1.
        if (out.empty() || s.size() != out.size() || s.back() != 1 ||
            !std::equal(s.begin(), s.end() - 1, out.begin()))
          return false;
      }
    }
    return true;
  };
  // Kinds follow from the candidates: a reduction's result is broadcast tiles, an
  // elementwise result is too when all its operands are (or constants), else rows.
  auto assign_kinds = [&]() {
    kinds_.clear();
    for (size_t k = 0; k < N; ++k) {
      if (!cand[k]) continue;
      const Node& n = g_.nodes[k];
      const bool bcast = reduction(n) || (!column(n) && row_values(n));
      kinds_[n.output] = bcast ? RegionValue::kBcast : RegionValue::kRows;
    }
  };
  for (bool changed = true; changed;) {
    changed = false;
    assign_kinds();
    for (size_t k = 0; k < N; ++k)
      if (cand[k] && !operands_ok(k)) cand[k] = false, changed = true;
    if (changed) continue;
    // Connected sets (union-find over the candidates' edges).
    std::vector<size_t> parent(N);
    for (size_t k = 0; k < N; ++k) parent[k] = k;
    std::function<size_t(size_t)> find = [&](size_t k) { return parent[k] == k ? k : parent[k] = find(parent[k]); };
    for (size_t k = 0; k < N; ++k)
      if (cand[k])
        for (const std::string& in : g_.nodes[k].inputs)
          if (inside(in)) parent[find(producer.at(in))] = find(k);
    std::map<size_t, std::vector<size_t>> sets;
    for (size_t k = 0; k < N; ++k)
      if (cand[k]) sets[find(k)].push_back(k);
    // Each connected set is a unit; those whose values fit are merged below.
    struct Unit {
      std::vector<size_t> members;
      int64_t bytes = 0;
      size_t dep = 0;  // 1 + the index of the last node an operand from outside comes from (0: none)
      bool reduces = false;
    };
    const int64_t budget = static_cast<int64_t>(opt_.target.vmem_bytes / 4);
    std::vector<Unit> units;
    for (const auto& [rep, members] : sets) {
      const size_t first = members.front();
      // Every operand from outside exists before the set's first node: those that
      // read one made later leave (all at once: a node whose operand leaves is looked
      // at again, its operand then from outside but made before it).
      std::vector<size_t> late;
      Unit u;
      u.members = members;
      for (size_t k : members)
        for (const std::string& in : g_.nodes[k].inputs) {
          auto p = producer.find(in);
          if (inside(in) || p == producer.end()) continue;
          if (p->second > first) late.push_back(k);
          u.dep = std::max(u.dep, p->second + 1);
        }
      for (size_t k : late) cand[k] = false;
      if (!late.empty()) {
        changed = true;
        break;
      }
      for (size_t k : members) {
        const Node& n = g_.nodes[k];
        u.reduces = u.reduces || reduction(n) || column(n);
        u.bytes += region_bytes(region_view(t_.at(n.output).type, kinds_.at(n.output) == RegionValue::kBcast));
        for (const std::string& in : n.inputs)
          if (!inside(in) && !scalar_const(in)) u.bytes += region_bytes(region_view(t_.at(in).type, false));
      }
      if (u.bytes > budget) {
        for (size_t k : members) cand[k] = false;
        continue;
      }
      units.push_back(std::move(u));
    }
    if (changed) continue;
    // Horizontal merging: a unit joins the latest kernel that runs after every node its
    // operands come from and has room for it (a training step's small parameters'
    // updates, each its own chain, become one kernel, their DMAs in flight together).
    // A kernel is kept if it holds a reduction and another node, or two units.
    std::sort(units.begin(), units.end(),
              [](const Unit& a, const Unit& b) { return a.members.front() < b.members.front(); });
    struct Group {
      std::vector<size_t> members;
      int64_t bytes = 0;
      int units = 0;
      bool reduces = false;
    };
    std::vector<Group> groups;
    for (const Unit& u : units) {
      Group* into = nullptr;
      for (auto it = groups.rbegin(); it != groups.rend() && it->members.front() >= u.dep; ++it)
        if (it->bytes + u.bytes <= budget) {
          into = &*it;
          break;
        }
      if (!into) into = &groups.emplace_back();
      into->members.insert(into->members.end(), u.members.begin(), u.members.end());
      into->bytes += u.bytes;
      into->units += 1;
      into->reduces = into->reduces || u.reduces;
    }
    for (Group& gr : groups) {
      if (!(gr.reduces && gr.members.size() >= 2) && gr.units < 2) continue;
      std::sort(gr.members.begin(), gr.members.end());
      const Node& root = g_.nodes[gr.members.front()];
      auto& nodes = regions_[root.id];
      for (size_t k : gr.members) {
        const Node& n = g_.nodes[k];
        nodes.push_back(&n);
        region_of_[n.id] = root.id;
        // Exported: read by a node outside the region, or a graph output.
        int inner = 0;
        for (size_t j : gr.members)
          for (const std::string& in : g_.nodes[j].inputs) inner += in == n.output;
        if (outputs.count(n.output) || uses[n.output] > inner) region_exports_.insert(n.output);
      }
    }
  }
  for (auto it = kinds_.begin(); it != kinds_.end();) {
    auto p = producer.find(it->first);
    it = region_of_.count(g_.nodes[p->second].id) ? std::next(it) : kinds_.erase(it);
  }
}

Emitter::RegionValue::Kind Emitter::region_kind(const std::string& t) const {
  auto it = kinds_.find(t);
  return it == kinds_.end() ? RegionValue::kRows : it->second;
}

// VMEM bytes of a value: rows with room for the strided loads past the last row (a
// group's 8 rows and a tile's 128 lanes) and a whole tile past its end (dense tiles'
// loads and stores), or a 4 KiB tile per group of 8 rows.
int64_t Emitter::region_bytes(const RegionValue& v) {
  if (v.kind == RegionValue::kBcast) return (v.rows + 7) / 8 * kTileElems * v.e;
  return align_up((v.rows + 8) * v.len * v.e + kTileElems * v.e, 512);
}

// The region's kernel, on core 0 (the others wait at the barrier after it): its
// operands from outside come into VMEM (one DMA each), every node runs over its
// view's row groups in graph order, each value into its VMEM buffer, and the values
// other nodes read (or graph outputs) go to HBM as soon as they are made. Each node
// does what its own kernel did, element for element: a row reduction is lower_rows's
// (tile 0, then the later tiles in order, the last tile's lanes past the row the
// identity, then vreduce.lanes; a mean divides by the length), a column reduction
// lower_columns's, an elementwise op its recipe (emit_op) with a row value in every
// lane of its row.
void Emitter::lower_row_region(const Node& root) {
  const std::vector<const Node*>& nodes = regions_.at(root.id);
  cur_ = 0;
  std::map<std::string, RegionValue> v;
  std::set<std::string> made;  // the region's own values
  for (const Node* n : nodes) made.insert(n->output);
  int64_t top = 0;
  bool loaded = false;
  auto place = [&](const std::string& name, RegionValue rv) {
    rv.addr = top;
    top += align_up(region_bytes(rv), 512);
    v[name] = rv;
  };
  for (const Node* n : nodes)
    for (const std::string& in : n->inputs) {
      if (v.count(in) || made.count(in)) continue;
      if (const std::optional<float> u = uniform_value(g_, in)) {
        RegionValue k;
        k.kind = RegionValue::kConst;
        k.value = *u;
        v[in] = k;
        continue;
      }
      place(in, region_view(t_.at(in).type, false));
      dma(vmem(v[in].addr), hbm(t_.at(in).addr), num_elements(t_.at(in).type.shape) * v[in].e);
      loaded = true;
    }
  for (const Node* n : nodes)
    place(n->output, region_view(t_.at(n->output).type, region_kind(n->output) == RegionValue::kBcast));
  auto down_columns = [&](const Node& n) { return column_reduction(n, t_.at(n.inputs[0]).type.shape.size()); };
  // A row reduction's operand viewed as outer rows of the reduced axes' elements.
  auto reduction_view = [&](const Node& n) {
    const Shape& xs = t_.at(n.inputs[0]).type.shape;
    RegionValue x = v.at(n.inputs[0]);
    x.len = num_elements(Shape(xs.begin() + n.attr_ints("axes").front(), xs.end()));
    x.rows = num_elements(xs) / std::max<int64_t>(x.len, 1);
    return x;
  };
  // The rows of a strided access; a view of one row reads it in every sublane.
  auto stride = [](const RegionValue& rv) { return ", stride=" + std::to_string(rv.rows == 1 ? 0 : rv.len * rv.e); };
  // A row reduction over more axes than the last views its operand as longer rows,
  // whose strided loads read past the operand's buffer (into the next ones, or this
  // guard at the end).
  int64_t guard = 0;
  for (const Node* n : nodes)
    if (reduces(*n) && !down_columns(*n)) {
      const RegionValue rv = reduction_view(*n);
      if (rv.rows > 1) guard = std::max(guard, 8 * rv.len * rv.e);
    }
  if (static_cast<uint64_t>(top + guard) > opt_.target.vmem_bytes) fail(root, "row region too large for VMEM");
  if (loaded) wait_dmas();
  // Registers: a node steps over sets of row groups (or lane blocks) in lockstep, so
  // their latencies overlap (a lane reduction's is 79 cycles on v3), each group w
  // registers of v0..v29: a reduction's accumulator and tile, an elementwise op's
  // operands (its result over the first) and the scratch of the recipes that take
  // it; v30 and v31 hold constants.
  int w = 2;
  auto set_of = [&](const Node& n) {
    const bool scratch = n.op == OpKind::kRelu || n.op == OpKind::kReluGrad || n.op == OpKind::kSigmoid ||
                         n.op == OpKind::kGelu || n.op == OpKind::kClip;
    w = scratch ? 4 : 2;
    return 30 / w;
  };
  auto reg = [&](int64_t j, int r) { return static_cast<int>(w * j + r); };
  auto vr = [](int r) { return "v" + std::to_string(r); };
  auto tile_addr = [&](const RegionValue& rv, int64_t g, int64_t t) {
    if (rv.kind == RegionValue::kBcast) return rv.addr + g * kTileElems * rv.e;
    return rv.addr + (g * 8 * rv.len + t * 128) * rv.e;
  };
  // Operand rv into register r: a constant in every lane, else the tile at VMEM addr
  // (`rows`: the stride of a strided one).
  auto load_at = [&](const RegionValue& rv, int r, int64_t addr, const std::string& rows) {
    if (rv.kind == RegionValue::kConst) line("vbcast " + vr(r) + ", " + fimm(rv.value));
    else line(std::string(ld(rv.dt)) + " " + vr(r) + ", " + at(addr) + rows);
  };
  // Operand `in` of group g, tile t into register r.
  auto load = [&](const std::string& in, int64_t g, int64_t t, int r) {
    const RegionValue& rv = v.at(in);
    if (rv.kind == RegionValue::kBcast) load_at(rv, r, tile_addr(rv, g, 0), "");
    else load_at(rv, r, tile_addr(rv, g, t), rv.kind == RegionValue::kRows ? stride(rv) : "");
  };
  for (const Node* np : nodes) {
    const Node& n = *np;
    const RegionValue& out = v.at(n.output);
    const bool max = n.op == OpKind::kReduceMax;
    const int64_t per_set = set_of(n);
    if (down_columns(n)) {
      // Down the columns of [R, L], as lower_columns: per 128-lane block, the tile of
      // rows 0-7, then each later group of 8 rows added in order (the last group's rows
      // past R the identity), then vreduce.sublanes; a mean divides by R. The result,
      // rows of one row, is sublane 0 of each block.
      const RegionValue& x = v.at(n.inputs[0]);
      const int64_t ng = (x.rows + 7) / 8, rr = x.rows - (ng - 1) * 8;
      const int64_t nb = (x.len + 127) / 128, rem = x.len - (nb - 1) * 128;
      line("vbcast v30, " + (max ? fimm(-INFINITY) : std::string("0.0")));
      if (n.op == OpKind::kReduceMean) line("vbcast v31, " + fimm(static_cast<float>(x.rows)));
      if (rr < 8) line("vmask m1, " + std::to_string(rr) + ", 128");
      line("vmask m3, 1, " + std::to_string(rem));
      if (nb > 1) line("vmask m4, 1, 128");
      for (int64_t b0 = 0; b0 < nb; b0 += per_set) {
        const int64_t b1 = std::min(nb, b0 + per_set);
        for (int64_t g = 0; g < ng; ++g) {
          for (int64_t b = b0; b < b1; ++b)
            line(std::string(ld(x.dt)) + " " + vr(reg(b - b0, 1)) + ", " + at(tile_addr(x, g, b)) + stride(x));
          for (int64_t b = b0; b < b1; ++b) {
            const std::string acc = vr(reg(b - b0, 0)), tl = vr(reg(b - b0, 1));
            if (g == ng - 1 && rr < 8) line("vsel " + tl + ", m1, " + tl + ", v30");
            if (g == 0) line("vmov " + acc + ", " + tl);
            else line(std::string(max ? "vmax " : "vadd ") + acc + ", " + acc + ", " + tl);
          }
        }
        const std::string tree = std::string("vreduce.sublanes.") + (max ? "max " : "sum ");
        for (int64_t b = b0; b < b1; ++b) line(tree + vr(reg(b - b0, 0)) + ", " + vr(reg(b - b0, 0)));
        for (int64_t b = b0; b < b1; ++b) {
          const std::string acc = vr(reg(b - b0, 0));
          if (n.op == OpKind::kReduceMean) line("vdiv " + acc + ", " + acc + ", v31");
          line(std::string(st(out.dt)) + " " + acc + ", " + at(tile_addr(out, 0, b)) + stride(out) +
               (b == nb - 1 ? ", mask=m3" : ", mask=m4"));
        }
      }
    } else if (reduces(n)) {  // over the innermost axes
      const RegionValue x = reduction_view(n);
      const int64_t len = x.len;
      const int64_t nt = (len + 127) / 128, rem = len - (nt - 1) * 128, ng = (x.rows + 7) / 8;
      line("vbcast v30, " + (max ? fimm(-INFINITY) : std::string("0.0")));
      if (n.op == OpKind::kReduceMean) line("vbcast v31, " + fimm(static_cast<float>(len)));
      if (rem < 128) line("vmask m1, 8, " + std::to_string(rem));
      // Rows of one tile load into their accumulators: a register a group, so up to 30
      // groups' lane reductions are in flight at once.
      if (nt == 1) w = 1;
      const int64_t per = nt == 1 ? 30 : per_set;
      for (int64_t g0 = 0; g0 < ng; g0 += per) {
        const int64_t g1 = std::min(ng, g0 + per);
        for (int64_t t = 0; t < nt; ++t) {
          const int tile_reg = nt == 1 ? 0 : 1;
          for (int64_t g = g0; g < g1; ++g)
            line(std::string(ld(x.dt)) + " " + vr(reg(g - g0, tile_reg)) + ", " + at(tile_addr(x, g, t)) + stride(x));
          for (int64_t g = g0; g < g1; ++g) {
            const std::string acc = vr(reg(g - g0, 0)), tl = vr(reg(g - g0, tile_reg));
            if (t == nt - 1 && rem < 128) line("vsel " + tl + ", m1, " + tl + ", v30");
            if (t == 0 && nt > 1) line("vmov " + acc + ", " + tl);
            else if (t > 0) line(std::string(max ? "vmax " : "vadd ") + acc + ", " + acc + ", " + tl);
          }
        }
        // Every lane reduction of the set before the first use of one (in-order
        // dispatch: a store waiting on its 79 cycles held up the next group's).
        const std::string tree = std::string("vreduce.lanes.") + (max ? "max " : "sum ");
        for (int64_t g = g0; g < g1; ++g) line(tree + vr(reg(g - g0, 0)) + ", " + vr(reg(g - g0, 0)));
        for (int64_t g = g0; g < g1; ++g) {
          const std::string acc = vr(reg(g - g0, 0));
          if (n.op == OpKind::kReduceMean) line("vdiv " + acc + ", " + acc + ", v31");
          line(std::string(st(out.dt)) + " " + acc + ", " + at(tile_addr(out, g, 0)));
        }
      }
    } else if (out.kind == RegionValue::kRows &&
               std::none_of(n.inputs.begin(), n.inputs.end(),
                            [&](const std::string& in) { return v.at(in).kind == RegionValue::kBcast; })) {
      // Operands of the result's elements (or constants) only: any view will do, as the
      // values are contiguous in VMEM, so dense tiles of 1,024 elements (the bundled
      // CNN's [16, 27] stem weight would be 2 row groups of 27 lanes). The last tile is
      // stored whole, into its buffer's spare tile.
      const int64_t tiles = (out.rows * out.len + kTileElems - 1) / kTileElems;
      for (int64_t k0 = 0; k0 < tiles; k0 += per_set) {
        const int64_t k1 = std::min(tiles, k0 + per_set);
        for (int64_t k = k0; k < k1; ++k)
          for (size_t i = 0; i < n.inputs.size(); ++i) {
            const RegionValue& rv = v.at(n.inputs[i]);
            load_at(rv, reg(k - k0, static_cast<int>(i)), rv.addr + k * kTileElems * rv.e, "");
          }
        for (int64_t k = k0; k < k1; ++k) {
          const int64_t j = k - k0;
          emit_op(n, reg(j, 0), reg(j, 0), reg(j, n.inputs.size() > 1 ? 1 : 0), reg(j, 2), reg(j, 3));
        }
        for (int64_t k = k0; k < k1; ++k)
          line(std::string(st(out.dt)) + " " + vr(reg(k - k0, 0)) + ", " + at(out.addr + k * kTileElems * out.e));
      }
    } else {
      const int64_t nt = out.kind == RegionValue::kBcast ? 1 : (out.len + 127) / 128;
      const int64_t rem = out.kind == RegionValue::kBcast ? 128 : out.len - (nt - 1) * 128;
      const int64_t ng = (out.rows + 7) / 8, last_rows = out.rows - (ng - 1) * 8;
      // Stores of rows: m1 the last tile's lanes, m3 and m4 the last group's rows.
      if (out.kind == RegionValue::kRows) {
        if (rem < 128) line("vmask m1, 8, " + std::to_string(rem));
        if (last_rows < 8) line("vmask m3, " + std::to_string(last_rows) + ", " + std::to_string(rem));
        if (last_rows < 8 && nt > 1) line("vmask m4, " + std::to_string(last_rows) + ", 128");
      }
      for (int64_t g0 = 0; g0 < ng; g0 += per_set) {
        const int64_t g1 = std::min(ng, g0 + per_set);
        for (int64_t t = 0; t < nt; ++t) {
          for (int64_t g = g0; g < g1; ++g)
            for (size_t i = 0; i < n.inputs.size(); ++i) load(n.inputs[i], g, t, reg(g - g0, static_cast<int>(i)));
          for (int64_t g = g0; g < g1; ++g) {
            const int64_t j = g - g0;
            emit_op(n, reg(j, 0), reg(j, 0), reg(j, n.inputs.size() > 1 ? 1 : 0), reg(j, 2), reg(j, 3));
          }
          for (int64_t g = g0; g < g1; ++g) {
            const int64_t j = g - g0;
            if (out.kind == RegionValue::kBcast) {
              line(std::string(st(out.dt)) + " " + vr(reg(j, 0)) + ", " + at(tile_addr(out, g, 0)));
              continue;
            }
            const bool last_tile = t == nt - 1, ragged_rows = g == ng - 1 && last_rows < 8;
            std::string mask;
            if (ragged_rows) mask = last_tile ? ", mask=m3" : ", mask=m4";
            else if (last_tile && rem < 128) mask = ", mask=m1";
            line(std::string(st(out.dt)) + " " + vr(reg(j, 0)) + ", " + at(tile_addr(out, g, t)) + stride(out) + mask);
          }
        }
      }
    }
    if (region_exports_.count(n.output)) {
      const int64_t y = t_.at(n.output).addr;
      if (out.kind == RegionValue::kBcast) dma(hbm(y), vmem(out.addr), out.e, dim(out.rows, 128 * out.e, out.e));
      else dma(hbm(y), vmem(out.addr), out.rows * out.len * out.e);
    }
  }
  wait_dmas();
}

}  // namespace tpusim::compiler::lowering
