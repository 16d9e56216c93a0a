#include "compiler/lower/lower.h"

#include "compiler/lower/emitter.h"
#include "compiler/lower/vmem_plan.h"
#include "compiler/passes/passes.h"
#include "isa/asm/assembler.h"
#include "isa/numerics/bf16.h"

namespace tpusim::compiler {
namespace lowering {

namespace {
// The host infeed's flag: no node lowering or collective uses f63 (replicate.cpp
// uses the same one for its per-chip infeed).
constexpr const char* kInfeedFlag = "f63";
}  // namespace

LowerResult Emitter::run() {
  const isa::Target& t = opt_.target;
  // A replica's program names the other replicas' chips and cores (collectives).
  out_ << ".target chips=" << std::max<uint32_t>(1, t.chips) << " cores=" << std::max(cores_, opt_.replicas.cores_per_chip) << " mxus=" << t.mxus_per_core << " mxu_rows=" << t.mxu_rows
       << " mxu_cols=" << t.mxu_cols << " fifo_rows=" << t.fifo_rows << " vmem=" << t.vmem_bytes
       << " smem=" << t.smem_bytes << " hbm=" << t.hbm_bytes << " host=" << t.host_bytes << "\n";
  std::vector<isa::IoEntry> io;
  auto entry = [&](isa::IoKind kind, const std::string& name, const TensorType& type, int64_t addr) {
    isa::IoEntry e;
    e.kind = kind;
    e.name = name;
    // i64 graph inputs (gather indices) enter the bundle as i32: the index checks
    // of lower_gather fault on anything outside the gathered axis.
    e.dtype = type.dtype == DType::kBf16 ? isa::Dtype::kBf16 : type.dtype == DType::kI64 ? isa::Dtype::kI32 : isa::Dtype::kF32;
    e.shape = type.shape;
    e.space = isa::Space::kHbm;
    e.addr = static_cast<uint64_t>(addr);
    return e;
  };
  // Inputs and constants keep their homes for the whole step (the bundle loads them).
  auto place = [&](const std::string& name, const TensorType& type) {
    t_[name] = Placed{type, place_hbm_pinned(num_elements(type.shape) * esz(type.dtype))};
    return t_[name].addr;
  };
  // Host infeed: each input's home stays in HBM; its I/O entry moves to host
  // memory, and the step's first instructions feed it over the PCIe link. The
  // replicated driver (replicate.cpp) feeds its replicas' slices itself.
  const bool infeed = opt_.inputs_from_host && opt_.replicas.replicas <= 1;
  struct Feed {
    int64_t host_addr, hbm_addr, bytes;
  };
  std::vector<Feed> feeds;
  int64_t host_top = 0;
  for (const auto& in : g_.inputs) {
    isa::IoEntry e = entry(isa::IoKind::kInput, in.name, in.type, place(in.name, in.type));
    if (infeed) {
      const int64_t bytes = num_elements(in.type.shape) * esz(in.type.dtype);
      feeds.push_back({host_top, static_cast<int64_t>(e.addr), bytes});
      e.space = isa::Space::kHost;
      e.addr = static_cast<uint64_t>(host_top);
      host_top = align_up(host_top + std::max<int64_t>(bytes, 1), kAlign);
    }
    io.push_back(std::move(e));
  }
  if (static_cast<uint64_t>(host_top) > t.host_bytes || host_top > INT32_MAX)
    throw CompileError(g_.name + ": the inputs need " + std::to_string(host_top) + " bytes of host memory, the target has " +
                       std::to_string(std::min<uint64_t>(t.host_bytes, INT32_MAX)));
  for (const auto& c : g_.constants) {
    if (c.type.dtype == DType::kI64) continue;  // indices known at compile time: lower_gather reads them
    isa::IoEntry e = entry(isa::IoKind::kConst, c.name, c.type, place(c.name, c.type));
    for (float f : c.f) {
      uint32_t u;
      std::memcpy(&u, &f, 4);
      if (c.type.dtype == DType::kBf16) {
        const uint16_t h = num::fp32_to_bf16(f);  // exact: the policy pass rounded it
        e.data.push_back(static_cast<uint8_t>(h));
        e.data.push_back(static_cast<uint8_t>(h >> 8));
      } else {
        for (int k = 0; k < 4; ++k) e.data.push_back(static_cast<uint8_t>(u >> (8 * k)));
      }
    }
    io.push_back(std::move(e));
  }
  if (hbm_top_ > kAddrReach)
    throw CompileError(g_.name + ": the inputs and constants end at HBM address " + std::to_string(hbm_top_) +
                       ", beyond what [sA + imm] reaches (" + std::to_string(kAddrReach) + ")");
  for (const auto& n : g_.nodes) {
    const std::string where = g_.name + ": node '" + n.output + "' (#" + std::to_string(n.id) + ", " + op_name(n.op) + ")";
    if (n.type.dtype == DType::kI64)
      throw CompileError(where + ": i64 results are not supported by the lowering (only gather indices)");
    // A result past the reachable HBM fails here, before its lowering plans for it (a
    // conv padded by 2^31 rows: minutes of planning, then out of host memory).
    // (The verifier bounds every tensor to 2^40 elements, so the product fits.)
    const int64_t bytes = num_elements(n.type.shape) * esz(n.type.dtype);
    if (bytes > kAddrReach)
      throw CompileError(where + ": its result of " + std::to_string(bytes) +
                         " bytes is larger than the HBM [sA + imm] reaches (" + std::to_string(kAddrReach) + ")");
    t_[n.output] = Placed{n.type, -1};  // placed when its node (or its fusion root) runs
  }

  plan_fusion();
  // Liveness over the node order: a result is placed at the step that writes it (its
  // fusion root's, for a fused member) and given back after the last step that
  // reads it (a fused member's reads happen at its root, earlier: later is safe; a
  // feeder's may come after it, at its root's step, and count there).
  // Graph outputs keep their homes.
  const size_t N = g_.nodes.size();
  std::map<std::string, size_t> producer;
  std::map<int, size_t> index_of;
  for (size_t k = 0; k < N; ++k) {
    producer[g_.nodes[k].output] = k;
    index_of[g_.nodes[k].id] = k;
  }
  std::vector<std::vector<size_t>> defined_at(N), last_read_at(N);
  std::vector<size_t> last(N);
  for (size_t k = 0; k < N; ++k) {
    const Node& n = g_.nodes[k];
    const size_t def = fused_away(n) ? index_of.at(fused_.at(n.id)) : k;
    defined_at[def].push_back(k);
    last[k] = def;
  }
  for (size_t k = 0; k < N; ++k) {
    const Node& n = g_.nodes[k];
    const size_t read = fused_away(n) ? std::max(k, index_of.at(fused_.at(n.id))) : k;
    for (const auto& in : n.inputs) {
      auto it = producer.find(in);
      if (it != producer.end()) last[it->second] = std::max(last[it->second], read);
    }
  }
  // A fusion root and the members before its chain's end never store their result
  // (the kernel keeps it in registers): they get no HBM, but for those other nodes
  // read too (side_stored_).
  std::vector<bool> stored(N, true);
  for (size_t k = 0; k < N; ++k) {
    const Node& n = g_.nodes[k];
    if (region_of_.count(n.id)) {  // a row region keeps its values in VMEM but those read outside it
      stored[k] = region_exports_.count(n.output) > 0;
      continue;
    }
    if (side_stored_.count(n.output)) continue;
    if (!chain_of(n).empty()) stored[k] = false;
    if (fused_away(n) && chain_of(g_.nodes[index_of.at(fused_.at(n.id))]).back() != &n) stored[k] = false;
  }
  std::set<std::string> kept(g_.outputs.begin(), g_.outputs.end());
  // A transpose of perm [0, 2, 1, 3] (attention's head split and merge) read only by a
  // matmul, as its LHS or RHS, is a view the matmul reads with strides (views_): its
  // result is its operand's bytes. One whose operand is a matmul's result read by it
  // alone has that matmul store its result so: the transpose's result is the matmul's
  // bytes. BERT's Q and V splits and its merge each copied 3 MB at batch 8.
  std::map<std::string, int> readers;
  std::map<std::string, size_t> reader_at;
  for (size_t k = 0; k < N; ++k)
    for (const auto& in : g_.nodes[k].inputs) ++readers[in], reader_at[in] = k;
  for (const auto& o : g_.outputs) readers[o] += 2;
  plan_read_past(producer, readers, kept);
  for (size_t k = 0; k < N; ++k)
    if (read_past_.count(g_.nodes[k].id)) stored[k] = false;  // its only reader reads its operands instead
  auto head_swap = [](const Node& t) {
    return t.op == OpKind::kTranspose && t.type.shape.size() == 4 &&
           t.attr_ints("perm") == std::vector<int64_t>{0, 2, 1, 3};
  };
  auto head_view_operand = [&](const Node& t) {
    if (readers[t.output] != 1) return false;
    const Node& m = g_.nodes[reader_at.at(t.output)];
    if (m.op != OpKind::kMatmul || fused_away(m) || m.type.shape.size() != 4 || m.inputs[0] == m.inputs[1] ||
        m.type.shape[0] != t.type.shape[0] || m.type.shape[1] != t.type.shape[1])
      return false;
    const char* trans = m.inputs[0] == t.output ? "trans_a" : "trans_b";
    return !(m.has_attr(trans) && m.attr_int(trans));
  };
  auto head_view_result = [&](const Node& t) {
    const auto p = producer.find(t.inputs[0]);
    if (p == producer.end() || readers[t.inputs[0]] != 1 || kept.count(t.output)) return false;
    const Node& m = g_.nodes[p->second];
    return m.op == OpKind::kMatmul && !fused_away(m) && chain_of(m).empty() && m.type.shape.size() == 4;
  };
  // transpose(reshape(dW, [KH,KW,CI,CO]), [3,2,0,1]) of a weight gradient read by it
  // alone (the training graph's dW in OIHW): the id of the matmul, which then stores
  // its result in that layout, so the transpose is its bytes; else -1.
  auto oihw_weight_grad = [&](const Node& t) {
    if (t.op != OpKind::kTranspose || t.type.shape.size() != 4 || kept.count(t.output) ||
        t.attr_ints("perm") != std::vector<int64_t>{3, 2, 0, 1} || readers[t.inputs[0]] != 1)
      return -1;
    const auto r = producer.find(t.inputs[0]);
    if (r == producer.end() || g_.nodes[r->second].op != OpKind::kReshape) return -1;
    const Node& rs = g_.nodes[r->second];
    const auto m = producer.find(rs.inputs[0]);
    if (m == producer.end() || readers[rs.inputs[0]] != 1 || kept.count(rs.inputs[0]) || kept.count(rs.output) ||
        !wgrads_.count(g_.nodes[m->second].id))
      return -1;
    const WGrad& w = wgrads_.at(g_.nodes[m->second].id);
    const int64_t CI = t_.at(w.x).type.shape[1], CO = t_.at(w.dy).type.shape[1];
    return rs.type.shape == Shape{w.KH, w.KW, CI, CO} ? g_.nodes[m->second].id : -1;
  };
  // A reshape or flatten (row-major: the same bytes in the same order) that is not a
  // graph output is its operand, not a copy of it: its result takes the operand's
  // address, and the tensor that owns those bytes (a chain of them resolves to it) is
  // given back after the last read of any of them. BERT's head splits and merges each
  // copied 3 MB at batch 8.
  // A slice whose elements are one run of its operand's (the axes before one take a
  // single index, those after it whole, step 1) and that is not a graph output is
  // those bytes too, at an offset: the data-parallel step's per-parameter slices of
  // the summed gradient bucket each copied their bytes (the v3-8 MLP step at batch 8:
  // 7.6 K cycles of its 105 K).
  std::map<std::string, int64_t> offset;  // aliased result -> its bytes' offset in its owner's
  auto run_offset = [&](const Node& n) -> int64_t {  // -1: not a run
    // (A head-split view's bytes are not its shape's row-major order.)
    if (n.op != OpKind::kSlice || kept.count(n.output) || views_.count(n.inputs[0])) return -1;
    const Shape& xs = t_.at(n.inputs[0]).type.shape;
    const Shape& ys = n.type.shape;
    const auto& starts = n.attr_ints("starts");
    const auto& steps = n.attr_ints("steps");
    if (xs.empty() || xs.size() != ys.size() || starts.size() != xs.size() || steps.size() != xs.size()) return -1;
    size_t k = 0;  // the one axis that may take a range
    while (k + 1 < xs.size() && ys[k] == 1) ++k;
    if (ys[k] > 1 && steps[k] != 1) return -1;
    int64_t off = 0, stride = 1;
    for (size_t d = xs.size(); d-- > 0;) {
      if (d > k && (ys[d] != xs[d] || starts[d] != 0)) return -1;
      off += starts[d] * stride;
      stride *= xs[d];
    }
    return off * esz(n.type.dtype);
  };
  std::map<std::string, std::string> owner;  // aliased result -> the tensor whose bytes it is
  for (size_t k = 0; k < N && opt_.reuse_hbm; ++k) {
    const Node& n = g_.nodes[k];
    const bool view = n.op == OpKind::kReshape || n.op == OpKind::kFlatten;
    const int64_t slice_off = run_offset(n);
    const std::string& src0 = view && owner.count(n.inputs[0]) ? owner.at(n.inputs[0]) : n.inputs[0];
    // A graph output is its operand's bytes too when those are a stored node result
    // that no output names: that result is then kept (never given back). A training
    // step's new weights and velocities of rank > 2 were each copied from their 2-D
    // update (the bundled CNN at v3 batch 8: 16 copies, ~15 K cycles).
    const bool out_view = view && kept.count(n.output) && producer.count(src0) && stored[producer.at(src0)] &&
                          !kept.count(src0) && !offset.count(n.inputs[0]);
    const bool reshape = view && (!kept.count(n.output) || out_view);
    if (out_view) kept.insert(src0);
    if (head_swap(n) && head_view_operand(n)) {
      const Shape& s = t_.at(n.inputs[0]).type.shape;
      views_[n.output] = HeadView{s[1], s[2], s[3]};
    } else if (head_swap(n) && head_view_result(n)) {
      views_[n.inputs[0]] = HeadView{n.type.shape[1], n.type.shape[2], n.type.shape[3]};
    } else if (const int m = oihw_weight_grad(n); m >= 0) {
      wgrads_.at(m).oihw = true;  // the weight gradient stores its result so
    } else if (!reshape && slice_off < 0) {
      continue;
    }
    const std::string src = owner.count(n.inputs[0]) ? owner.at(n.inputs[0]) : n.inputs[0];
    owner[n.output] = src;
    const int64_t base = offset.count(n.inputs[0]) ? offset.at(n.inputs[0]) : 0;
    if (base + std::max<int64_t>(slice_off, 0) > 0) offset[n.output] = base + std::max<int64_t>(slice_off, 0);
    stored[k] = false;
    if (const auto it = producer.find(src); it != producer.end()) last[it->second] = std::max(last[it->second], last[k]);
  }
  // A concat whose operands are each one run of its result (the axes before its axis
  // have one index) and are read by it alone, through views at most, is assembled in
  // place: its result is placed when its first operand's producer runs and each
  // operand's bytes are its run of them, so the concat has no code. The data-parallel
  // step's gradient bucket copied every gradient into it (the v3-8 MLP step at batch
  // 8: 7.4 K cycles of its 99 K).
  std::set<int> in_place;  // concat node ids
  {
    std::map<std::string, std::vector<size_t>> read_by;
    for (size_t k = 0; k < N; ++k)
      for (const auto& in : g_.nodes[k].inputs) read_by[in].push_back(k);
    auto root_of = [&](const std::string& t) { return owner.count(t) ? owner.at(t) : t; };
    std::map<std::string, std::vector<std::string>> bytes_of;  // a tensor and its views, by owner
    for (const auto& [t, r] : owner) bytes_of[r].push_back(t);
    for (size_t kc = 0; kc < N && opt_.reuse_hbm; ++kc) {
      const Node& c = g_.nodes[kc];
      if (c.op != OpKind::kConcat || kept.count(c.output) || !stored[kc]) continue;
      const Shape& os = c.type.shape;
      const int64_t axis = c.attr_int("axis");
      if (axis < 0 || num_elements(Shape(os.begin(), os.begin() + axis)) != 1) continue;
      const int64_t e = esz(c.type.dtype);
      std::vector<std::pair<size_t, int64_t>> runs;  // (operand's root producer, offset)
      std::set<std::string> roots;
      int64_t at_byte = 0;
      bool ok = true;
      for (const auto& in : c.inputs) {
        const std::string b = root_of(in);
        const auto p = producer.find(b);
        ok = ok && p != producer.end() && stored[p->second] && !kept.count(b) && roots.insert(b).second &&
             t_.at(b).type.dtype == c.type.dtype && num_elements(t_.at(b).type.shape) == num_elements(t_.at(in).type.shape);
        if (!ok) break;
        // b and its views are no head view, no output, and read only by each other and
        // this concat.
        std::vector<std::string> all = bytes_of[b];
        all.push_back(b);
        for (const std::string& t : all) {
          ok = ok && !views_.count(t) && !kept.count(t);
          for (size_t k : read_by[t]) ok = ok && (k == kc || root_of(g_.nodes[k].output) == b);
        }
        runs.emplace_back(p->second, at_byte);
        at_byte += num_elements(t_.at(in).type.shape) * e;
      }
      if (!ok || runs.empty()) continue;
      size_t first = kc;  // where the first operand is placed (a fused member's: its root's step)
      for (const auto& r : runs) {
        const Node& pn = g_.nodes[r.first];
        first = std::min(first, fused_away(pn) ? index_of.at(fused_.at(pn.id)) : r.first);
      }
      auto& here = defined_at[kc];
      here.erase(std::find(here.begin(), here.end(), kc));
      defined_at[first].insert(defined_at[first].begin(), kc);
      for (const auto& [pk, off] : runs) {
        const std::string b = g_.nodes[pk].output;
        stored[pk] = false;
        std::vector<std::string>& into = bytes_of[c.output];
        for (const std::string& t : bytes_of[b]) {
          owner[t] = c.output;
          offset[t] = off + (offset.count(t) ? offset.at(t) : 0);
          into.push_back(t);
        }
        owner[b] = c.output;
        if (off > 0) offset[b] = off;
        into.push_back(b);
        bytes_of.erase(b);
      }
      in_place.insert(c.id);
    }
  }
  for (size_t k = 0; k < N; ++k)
    if (stored[k] && !kept.count(g_.nodes[k].output)) last_read_at[last[k]].push_back(k);
  std::vector<std::pair<int64_t, int64_t>> given_back;  // freed when the next lowered node ends
  // A conv result that is its consumer's planes (plan_planes_out) gets the planes' bytes.
  plan_planes_out();
  auto result_bytes = [&](const Node& n) {
    const auto po = planes_out_.find(n.output);
    return po != planes_out_.end() ? po->second.bytes : num_elements(n.type.shape) * esz(n.type.dtype);
  };
  if (!feeds.empty()) {
    // One infeed DMA per input (the host prepares each as a batch), on core 0; the
    // other cores start after the barrier. Its own flag, apart from the nodes'.
    cur_ = 0;
    line("op " + std::to_string(g_.nodes.empty() ? 0 : g_.nodes.front().id));
    for (const Feed& f : feeds)
      line("dma " + hbm(f.hbm_addr) + ", host:[s0 + " + std::to_string(f.host_addr) + "], bytes=" +
           std::to_string(f.bytes) + ", flag=" + kInfeedFlag);
    line(std::string("wait ") + kInfeedFlag + ", " + std::to_string(feeds.size()));
    sync_all();
  }
  for (size_t k = 0; k < N; ++k) {
    const Node& n = g_.nodes[k];
    for (size_t j : defined_at[k])
      if (stored[j]) {
        const int64_t a = alloc_hbm(result_bytes(g_.nodes[j]), true);
        check_addr(g_.nodes[j], a);
        t_[g_.nodes[j].output].addr = a;
      } else if (const auto o = owner.find(g_.nodes[j].output); o != owner.end()) {
        const auto off = offset.find(g_.nodes[j].output);
        t_[g_.nodes[j].output].addr = t_.at(o->second).addr + (off == offset.end() ? 0 : off->second);
      }
    for (size_t j : last_read_at[k]) given_back.emplace_back(t_.at(g_.nodes[j].output).addr, result_bytes(g_.nodes[j]));
    if (fused_away(n)) continue;  // its root's kernel applied it (fusion.cpp)
    if (read_past_.count(n.id)) continue;  // its reader reads its operands (grad.cpp, plan_read_past)
    for (auto& c : cs_) c << "  op " << n.id << "\n";
    cur_ = 0;
    // A std::logic_error out of a lowering (an index out of range, ...) is a bug of the
    // compiler, not of the graph; it names the node being lowered, as a bad input does.
    try {
      if (regions_.count(n.id)) lower_row_region(n);
      else switch (n.op) {
        case OpKind::kMatmul:
          if (wgrads_.count(n.id)) {
            lower_conv_wgrad(n);
            break;
          }
          epi_ = chain_of(n);
          lower_matmul(n);
          break;
        case OpKind::kConv2d: lower_conv(n); break;
        case OpKind::kAllReduce: lower_all_reduce(n); break;
        case OpKind::kAllGather:
        case OpKind::kReduceScatter:
        case OpKind::kAllToAll: lower_direct_collective(n); break;
        case OpKind::kTranspose:
          if (!owner.count(n.output)) lower_transpose(n);  // else a matmul's view of its bytes
          break;
        case OpKind::kMaxPool: lower_pool(n); break;
        case OpKind::kAvgPool: {
          const auto& p = n.attr_ints("pads");
          if ((p[0] || p[1] || p[2] || p[3]) && n.attr_int("count_include_pad") == 0) lower_avgpool_exclude_pad(n);
          else lower_pool(n);
          break;
        }
        case OpKind::kConcat:
          if (!in_place.count(n.id)) lower_concat(n);  // else its operands' producers wrote it
          break;
        case OpKind::kSlice:
          if (!owner.count(n.output)) lower_slice(n);  // else a run of its operand's bytes
          break;
        case OpKind::kPad: lower_pad(n); break;
        case OpKind::kGather: lower_gather(n); break;
        case OpKind::kBatchNorm: lower_batchnorm(n); break;
        case OpKind::kReshape:
        case OpKind::kFlatten:
          if (!owner.count(n.output)) lower_copy(n);  // else it is its operand's bytes
          break;
        case OpKind::kMaxPoolGrad: lower_maxpool_grad(n); break;
        case OpKind::kReverse: lower_reverse(n); break;
        case OpKind::kIm2col: lower_im2col(n); break;
        case OpKind::kSoftmax:
        case OpKind::kReduceSum:
        case OpKind::kReduceMean:
        case OpKind::kReduceMax: lower_axis_op(n); break;
        case OpKind::kLayerNorm:
        case OpKind::kGlobalAvgPool: lower_rows(n); break;
        default:
          if (!is_elementwise(n.op) && n.op != OpKind::kCast && n.op != OpKind::kIdentity)
            fail(n, "op is not supported by the lowering yet");
          lower_elementwise(n);
      }
    } catch (const std::logic_error& e) {
      fail(n, std::string("internal error of the lowering (please report it): ") + e.what());
    }
    for (const auto& b : node_scratch_) {
      check_addr(n, b.first);
      given_back.push_back(b);
    }
    node_scratch_.clear();
    // Memory given back may be written by the next node, on any core: every core
    // first waits for its own DMAs (they may still read or write it), and the
    // barrier tells the others.
    if (!given_back.empty() && opt_.reuse_hbm) drain_dmas();
    sync_all();
    for (const auto& b : given_back) free_hbm(b.first, b.second);
    given_back.clear();
  }
  for (int c = 0; c < cores_; ++c) {
    const std::string code = cs_[static_cast<size_t>(c)].str() + "  halt\n" + tail_[static_cast<size_t>(c)].str();
    const bool windows = code.find("[s31 + ") != std::string::npos || code.find("[s30 + ") != std::string::npos;
    out_ << ".core chip0.core" << c << "\n" << (windows ? window_setup() : "") << code;
  }
  for (auto& e : extra_consts_) io.push_back(std::move(e));  // laid out by the lowering (conv weights)
  for (const auto& o : g_.outputs) {
    const Placed& p = t_.at(o);
    io.push_back(entry(isa::IoKind::kOutput, o, p.type, p.addr));
  }
  if (static_cast<uint64_t>(hbm_top_) > t.hbm_bytes)
    throw CompileError(g_.name + ": needs " + std::to_string(hbm_top_) + " bytes of HBM, the target has " +
                       std::to_string(t.hbm_bytes));

  LowerResult r;
  r.assembly = out_.str();
  r.hbm_end = hbm_top_;
  r.notes = notes_;
  r.hbm_unplanned = opt_.hbm_base + hbm_sum_;
  r.fused = fused_;
  r.entry_token_slots = entry_token_slots_;
  // A replica's program is assembled and checked once, with every other replica's,
  // by lower_replicated, which takes only its text and I/O entries from here.
  if (opt_.replicas.replicas > 1) {
    r.bundle.io = std::move(io);
    return r;
  }
  try {
    r.bundle = isa::assemble(r.assembly, g_.name + ".s");
  } catch (const isa::AsmError& e) {
    throw CompileError(std::string("internal lowering error: ") + e.what());
  }
  r.bundle.io = std::move(io);
  const std::string err = isa::check_bundle(r.bundle);
  if (!err.empty()) throw CompileError(g_.name + ": internal lowering error: " + err);
  return r;
}

// Best fit over the free list (the smallest block that holds it, the lowest address
// of equal ones), else the block that ends at the high-water mark grown past it, else
// fresh memory at the mark: deterministic, so every replica gets the same layout.
int64_t Emitter::alloc_hbm(int64_t bytes, bool reuse) {
  const int64_t size = align_up(std::max<int64_t>(bytes, 1), kAlign);
  hbm_sum_ += size;
  if (reuse && opt_.reuse_hbm && !hbm_free_.empty()) {
    auto best = hbm_free_.end();
    for (auto it = hbm_free_.begin(); it != hbm_free_.end(); ++it)
      if (it->second >= size && (best == hbm_free_.end() || it->second < best->second)) best = it;
    if (best != hbm_free_.end()) {
      const int64_t a = best->first, rest = best->second - size;
      hbm_free_.erase(best);
      if (rest > 0) hbm_free_[a + size] = rest;
      fresh_.erase(a);
      return a;
    }
    auto top = std::prev(hbm_free_.end());
    if (top->first + top->second == hbm_top_) {
      const int64_t a = top->first;
      hbm_free_.erase(top);
      hbm_top_ = a + size;
      fresh_.erase(a);
      return a;
    }
  }
  const int64_t a = hbm_top_;
  hbm_top_ += size;
  fresh_.insert(a);
  return a;
}

void Emitter::free_hbm(int64_t a, int64_t bytes) {
  if (!opt_.reuse_hbm) return;
  auto it = hbm_free_.emplace(a, align_up(std::max<int64_t>(bytes, 1), kAlign)).first;
  auto next = std::next(it);
  if (next != hbm_free_.end() && it->first + it->second == next->first) {
    it->second += next->second;
    hbm_free_.erase(next);
  }
  if (it != hbm_free_.begin()) {
    auto prev = std::prev(it);
    if (prev->first + prev->second == it->first) {
      prev->second += it->second;
      hbm_free_.erase(it);
    }
  }
}

// Every core waits for every DMA it has issued on the lowering's flags (f1 and the
// per-op flags); counts already waited for are not waited for again.
void Emitter::drain_dmas() {
  for (cur_ = 0; cur_ < cores_; ++cur_) {
    const size_t c = static_cast<size_t>(cur_);
    if (dmas_[c] > drained_dmas_[c]) wait_dmas();
    drained_dmas_[c] = dmas_[c];
    for (const auto& f : flag_dmas_[c])
      if (f.second > drained_flags_[c][f.first]) {
        wait_flag(f.first);
        drained_flags_[c][f.first] = f.second;
      }
  }
  cur_ = 0;
}

}  // namespace lowering

LowerResult lower_graph(const Graph& graph, const LowerOptions& options) {
  if (options.replicas.replicas > 1) {
    LowerResult r = lower_replicated(graph, options);  // names its ops itself
    record_vmem_plan(r.bundle);
    record_op_flops(r.bundle, graph);
    return r;
  }
  Graph g = graph;
  apply_precision(g, options.policy);
  verify(g, "lowering");
  if (options.fuse) run_passes(g, {pass_by_name("fuse-elementwise")});
  if (options.cores < 1 || options.cores > 254) throw CompileError(g.name + ": cores must be 1..254");
  const std::string err = options.target.check();
  if (!err.empty()) throw CompileError(g.name + ": bad target: " + err);
  lowering::Emitter e(g, options);
  LowerResult r = e.run();
  record_vmem_plan(r.bundle);  // after assembly: the plan is read off the final code
  record_op_names(r.bundle, g, r.fused);
  record_op_flops(r.bundle, g);
  return r;
}

}  // namespace tpusim::compiler
