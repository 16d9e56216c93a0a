#include "compiler/lower/vmem_plan.h"

#include <algorithm>
#include <map>
#include <set>
#include <string>
#include <utility>
#include <vector>

#include "compiler/ir/graph.h"

namespace tpusim::compiler {

namespace {

using Span = std::pair<int64_t, int64_t>;  // [lo, hi) bytes

// The op ids the bundle's code carries: only those get a name or FLOPs.
std::set<int32_t> used_op_ids(const isa::Bundle& bundle) {
  std::set<int32_t> used;
  for (const auto& p : bundle.cores)
    for (const auto& in : p.code) used.insert(in.op_id);
  return used;
}

// Sorts and merges touching or overlapping spans in place.
void merge(std::vector<Span>& v) {
  std::sort(v.begin(), v.end());
  size_t out = 0;
  for (const Span& s : v) {
    if (out > 0 && s.first <= v[out - 1].second) v[out - 1].second = std::max(v[out - 1].second, s.second);
    else v[out++] = s;
  }
  v.resize(out);
}

}  // namespace

void record_vmem_plan(isa::Bundle& bundle) {
  for (auto& prog : bundle.cores) {
    std::map<int32_t, std::vector<Span>> spans;
    std::map<int32_t, size_t> merged_size;  // per op: size after the last merge (bounds memory on long programs)
    auto add = [&](int32_t op, int64_t lo, int64_t hi) {
      auto& v = spans[op];
      v.push_back({lo, hi});
      size_t& m = merged_size[op];
      if (v.size() > 2 * m + 4096) {
        merge(v);
        m = v.size();
      }
    };
    auto fail = [&](size_t i, uint8_t reg) {
      throw CompileError("internal lowering error: chip" + std::to_string(prog.chip) + ".core" +
                         std::to_string(prog.core) + " instruction " + std::to_string(i) + " (op " +
                         std::to_string(prog.code[i].op_id) + ") addresses VMEM through s" + std::to_string(reg) +
                         ": the VMEM plan needs addresses known at compile time");
    };
    for (size_t i = 0; i < prog.code.size(); ++i) {
      const isa::Instr& in = prog.code[i];
      switch (in.op) {
        case isa::Op::kVld:
        case isa::Op::kVldBf16:
        case isa::Op::kVst:
        case isa::Op::kVstBf16: {
          // The tile's 8 sublanes at addr + s * stride, 128 lanes each (the bounding
          // range of the race checker's BytePattern; masked lanes included).
          if (in.b != 0) fail(i, in.b);
          const int64_t es = (in.op == isa::Op::kVldBf16 || in.op == isa::Op::kVstBf16) ? 2 : 4;
          const int64_t span = (isa::kSublanes - 1) * static_cast<int64_t>(in.imm2);
          add(in.op_id, in.imm + std::min<int64_t>(0, span), in.imm + std::max<int64_t>(0, span) + isa::kLanes * es);
          break;
        }
        case isa::Op::kDma: {
          if (in.imm <= 0) break;
          bool empty = false;
          int64_t slo = 0, shi = 0, dlo = 0, dhi = 0;
          for (int d = 0; d < in.ndims; ++d) {
            empty |= in.dims[d].count == 0;
            const int64_t n = static_cast<int64_t>(in.dims[d].count) - 1;
            const int64_t so = n * in.dims[d].src_stride, dof = n * in.dims[d].dst_stride;
            (so < 0 ? slo : shi) += so;
            (dof < 0 ? dlo : dhi) += dof;
          }
          if (empty) break;
          // An endpoint in this core's own VMEM (docs/isa.md "DMA": no target = the
          // issuing core; a named chip without a core = its core 0).
          auto local = [&](const isa::DmaEndpoint& e) {
            if (e.space != isa::Space::kVmem) return false;
            const uint32_t chip = e.chip < 0 ? prog.chip : static_cast<uint32_t>(e.chip);
            const uint32_t core = e.core >= 0 ? static_cast<uint32_t>(e.core) : e.chip < 0 ? prog.core : 0;
            return chip == prog.chip && core == prog.core;
          };
          if (local(in.src)) {
            if (in.src.reg != 0) fail(i, in.src.reg);
            add(in.op_id, in.src.offset + slo, in.src.offset + shi + in.imm);
          }
          if (local(in.dst)) {
            if (in.dst.reg != 0) fail(i, in.dst.reg);
            add(in.op_id, in.dst.offset + dlo, in.dst.offset + dhi + in.imm);
          }
          break;
        }
        default: break;
      }
    }
    prog.vmem_plan.clear();
    for (auto& [op, v] : spans) {
      merge(v);
      for (const Span& s : v) {
        // Out-of-range accesses fault at run time; the plan keeps to VMEM.
        const int64_t lo = std::max<int64_t>(0, s.first);
        const int64_t hi = std::min<int64_t>(static_cast<int64_t>(bundle.target.vmem_bytes), s.second);
        if (hi > lo) prog.vmem_plan.push_back({op, static_cast<uint64_t>(lo), static_cast<uint64_t>(hi - lo)});
      }
    }
  }
}

void record_op_names(isa::Bundle& bundle, const Graph& graph, const std::map<int, int>& fused) {
  // Ids the lowering named itself (lower_replicated's scatter and gather) keep their names.
  std::map<int, std::string> names(bundle.op_names.begin(), bundle.op_names.end());
  for (const Node& n : graph.nodes) names[n.id] = std::string(op_name(n.op)) + " %" + n.output;
  for (const Node& n : graph.nodes) {
    auto root = fused.find(n.id);
    if (root != fused.end() && names.count(root->second)) names[root->second] += std::string(" +") + op_name(n.op);
  }
  const std::set<int32_t> used = used_op_ids(bundle);
  bundle.op_names.clear();
  for (const int32_t id : used) {
    const auto it = names.find(id);
    if (id < 0 || it == names.end()) continue;
    std::string s = it->second.substr(0, isa::kMaxOpNameBytes);
    for (char& ch : s)
      if (ch == '"' || static_cast<unsigned char>(ch) < 0x20 || ch == 0x7f) ch = '_';
    bundle.op_names[id] = s;
  }
}

void record_op_flops(isa::Bundle& bundle, const Graph& graph) {
  const std::set<int32_t> used = used_op_ids(bundle);
  const std::map<std::string, TensorType> types = graph.types();
  auto elements = [](const Shape& s) {
    uint64_t n = 1;
    for (int64_t d : s) n *= static_cast<uint64_t>(d);
    return n;
  };
  bundle.op_flops.clear();
  for (const Node& n : graph.nodes) {
    if (!used.count(n.id)) continue;
    const Shape& out = n.type.shape;
    if (n.op == OpKind::kMatmul && out.size() >= 2) {
      // Every output element is a K-long dot product (batch dims included).
      const Shape& a = types.at(n.inputs[0]).shape;
      const bool ta = n.has_attr("trans_a") && n.attr_int("trans_a");
      const uint64_t k = static_cast<uint64_t>(ta ? a[a.size() - 2] : a[a.size() - 1]);
      bundle.op_flops[n.id] = 2 * elements(out) * k;
    } else if (n.op == OpKind::kConv2d) {
      // Every output element sums its group's Cin/G channels over the KH x KW taps
      // (OIHW weights: dims 1..3), padding taps included as the graph defines them.
      const Shape& w = types.at(n.inputs[1]).shape;
      bundle.op_flops[n.id] = 2 * elements(out) * static_cast<uint64_t>(w[1] * w[2] * w[3]);
    }
  }
}

}  // namespace tpusim::compiler
