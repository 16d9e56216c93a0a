// Data-parallel lowering (docs/codegen.md "Replicas"): the per-replica graph lowered
// once per replica onto the cores of the board's chips, the global batch scattered
// from chip 0 and the batched outputs gathered back to it.
#include <algorithm>
#include <set>
#include <sstream>

#include "compiler/lower/emitter.h"
#include "compiler/lower/vmem_plan.h"
#include "compiler/passes/passes.h"
#include "isa/asm/assembler.h"

namespace tpusim::compiler {

namespace {
// Flags of the driver's prologue and epilogue, apart from the node lowerings' and
// the collectives' (collective.cpp, f20..f58).
constexpr const char* kIoIssue = "f60";   // scatter/gather DMAs issued by this core
constexpr const char* kInLanded = "f61";  // this replica's inputs have landed
constexpr const char* kOutLanded = "f62"; // on replica 0: the replicas' output slices have landed
constexpr const char* kInfeed = "f63";     // host infeed: this chip's infeed DMAs are done (lower.cpp's too)

// The code of a one-core program the emitter assembled: between its `.core` line and
// the closing `halt` of stream 0, and after it the forked streams' code (which ends
// in halts of its own), so the replica's epilogue goes in stream 0, not after them.
std::pair<std::string, std::string> core_code(const std::string& assembly) {
  const size_t core = assembly.find("\n.core ");
  const size_t start = assembly.find('\n', core + 1) + 1;
  const std::string halt = "  halt\n";
  size_t end = assembly.find("\n" + halt, start - 1) + 1;
  return {assembly.substr(start, end - start), assembly.substr(end + halt.size())};
}
// Host infeed (docs/training.md "Inputs from the host"): every chip's host feeds
// that chip over its own PCIe link: the chip's core 0 issues one infeed DMA per
// input and replica of the chip (flag kInfeed), inputs outermost, so the chip's
// cores get their last bytes one small batch apart; another core waits on its
// DMAs' rflag, which the host link counts as infeed too. The IO table holds each
// input once, in chip 0's host memory, so chip 0 first pushes the other chips
// their part of it over ICI into their host memory (an artefact of that table:
// on the real board the host's one DRAM feeds every link). Returns the DMAs
// issued on kIoIssue.
int host_infeed_prologue(std::ostringstream& text, const Graph& g, const ReplicaGraph& rg, const ReplicaSpec& s,
                         int r, const std::map<std::string, const isa::IoEntry*>& at,
                         const std::map<std::string, int64_t>& host_at, int64_t hbm_base, int64_t region) {
  const int R = s.replicas;
  const int chip = replica_chip(s, r), core = replica_core(s, r);
  auto bytes_of = [](const isa::IoEntry& e) { return static_cast<int64_t>(e.elements() * isa::dtype_size(e.dtype)); };
  // The replicas of chip c: [first, first + n).
  auto chip_replicas = [&](int c, int& first, int& n) {
    first = -1;
    n = 0;
    for (int q = 0; q < R; ++q)
      if (replica_chip(s, q) == c) {
        if (first < 0) first = q;
        ++n;
      }
  };
  const int64_t inputs = static_cast<int64_t>(g.inputs.size());
  int issued = 0;
  if (r == 0) {
    for (int c = 1; c < chips_used(s); ++c) {
      int first, n;
      chip_replicas(c, first, n);
      for (const auto& in : g.inputs) {
        const int64_t slice = bytes_of(*at.at(in.name));
        const bool batched = rg.batched_inputs.count(in.name) != 0;
        const int64_t a = host_at.at(in.name) + (batched ? first * slice : 0);
        text << "  dma host@chip" << c << ":" << lowering::addr_ref(a) << ", host:" << lowering::addr_ref(a)
             << ", bytes=" << (batched ? n * slice : slice) << ", flag=" << kIoIssue << ", rflag=" << kInLanded
             << "\n";
        ++issued;
      }
    }
  }
  if (core != 0) {
    text << "  wait " << kInLanded << ", " << inputs << "\n";  // the rflags of core 0's infeed
    return issued;
  }
  int first, n;
  chip_replicas(chip, first, n);
  if (chip != 0) text << "  wait " << kInLanded << ", " << inputs << "\n";  // chip 0's pushes are in our host memory
  for (const auto& in : g.inputs) {
    const isa::IoEntry& e = *at.at(in.name);
    const int64_t slice = bytes_of(e);
    const bool batched = rg.batched_inputs.count(in.name) != 0;
    const int64_t src = host_at.at(in.name) + (batched ? first * slice : 0);
    const int64_t dst = static_cast<int64_t>(e.addr) - hbm_base;  // core 0's region starts at 0
    // One DMA per core (one over both cores' regions would overlap the next
    // input's in the race checker's bounding ranges); core k's rflag rises with it.
    for (int k = 0; k < n; ++k)
      text << "  dma hbm" << (k ? "@c" + std::to_string(k) : std::string()) << ":" << lowering::addr_ref(dst + k * region)
           << ", host:" << lowering::addr_ref(src + (batched ? k * slice : 0)) << ", bytes=" << slice << ", flag=" << kInfeed
           << (k ? std::string(", rflag=") + kInLanded : std::string()) << "\n";
  }
  text << "  wait " << kInfeed << ", " << inputs * n << "\n";
  return issued;
}

}  // namespace

LowerResult lower_replicated(const Graph& graph, const LowerOptions& options) {
  const ReplicaSpec& s = options.replicas;
  check_replicas(s);
  if (options.cores != 1) throw CompileError(graph.name + ": --cores splits one chip's work; with --replicas it must be 1");
  Graph g = graph;
  apply_precision(g, options.policy);
  verify(g, "lowering");
  const std::string err = options.target.check();
  if (!err.empty()) throw CompileError(g.name + ": bad target: " + err);
  ReplicaGraph rg = replica_graph(g, s);
  // Fused as a single replica's graph is (lower_graph): a conv's relu in its epilogue.
  if (options.fuse) run_passes(rg.graph, {pass_by_name("fuse-elementwise")});
  const int R = s.replicas;
  const int cores = R <= s.cores_per_chip ? R : s.cores_per_chip;
  const int chips = chips_used(s);

  // Every replica's tensors follow one layout, at core * region on its chip.
  LowerOptions lo = options;
  lo.cores = 1;
  lo.replica = 0;
  lo.hbm_base = 0;
  lo.replica_region = 0;
  const LowerResult first = lowering::Emitter(rg.graph, lo).run();
  const int64_t region = lowering::align_up(first.hbm_end, lowering::kAlign);
  std::map<std::string, const isa::IoEntry*> local;
  for (const auto& e : first.bundle.io) local[e.name] = &e;

  // The global inputs and batched outputs live on chip 0 after its replicas' regions.
  std::vector<isa::IoEntry> io;
  int64_t top = cores * region;
  std::map<std::string, int64_t> global;
  // An entry on chip 0, core 0, at `end` of its memory (moved past it); `where` keeps its address.
  auto place_on_chip0 = [&](isa::IoEntry e, isa::IoKind kind, const TensorType& t, int64_t& end,
                            std::map<std::string, int64_t>& where) {
    e.kind = kind;
    e.shape = t.shape;
    e.chip = 0;
    e.core = 0;
    e.addr = static_cast<uint64_t>(end);
    where[e.name] = end;
    end = lowering::align_up(end + static_cast<int64_t>(e.elements() * isa::dtype_size(e.dtype)), lowering::kAlign);
    io.push_back(std::move(e));
  };
  auto place_global = [&](const isa::IoEntry& e, isa::IoKind kind, const TensorType& t) {
    place_on_chip0(e, kind, t, top, global);
  };
  const auto types = g.types();
  // Host infeed: the global inputs are in chip 0's host memory instead (the I/O
  // table gives a tensor one location), at the same addresses in every chip's.
  const bool infeed = options.inputs_from_host;
  std::map<std::string, int64_t> host_at;
  int64_t host_top = 0;
  for (const auto& in : g.inputs) {
    if (!infeed) {
      place_global(*local.at(in.name), isa::IoKind::kInput, in.type);
      continue;
    }
    isa::IoEntry h = *local.at(in.name);
    h.space = isa::Space::kHost;
    place_on_chip0(h, isa::IoKind::kInput, in.type, host_top, host_at);
  }
  if (static_cast<uint64_t>(host_top) > options.target.host_bytes || host_top > INT32_MAX)
    throw CompileError(g.name + ": the inputs need " + std::to_string(host_top) + " bytes of host memory, the target has " +
                       std::to_string(std::min<uint64_t>(options.target.host_bytes, INT32_MAX)));
  for (const auto& o : g.outputs)
    if (rg.batched_outputs.count(o)) place_global(*local.at(o), isa::IoKind::kOutput, types.at(o));
  if (top > lowering::kAddrReach)
    throw CompileError(g.name + ": " + std::to_string(R) + " replicas need " + std::to_string(top) +
                       " bytes of chip 0's HBM; [sA + imm] addresses reach " + std::to_string(lowering::kAddrReach));
  if (static_cast<uint64_t>(top) > options.target.hbm_bytes)
    throw CompileError(g.name + ": needs " + std::to_string(top) + " bytes of HBM on chip 0, the target has " +
                       std::to_string(options.target.hbm_bytes));

  // The scatter (or infeed) and the gather are ops of their own, after the graph's
  // ids, so a profile shows what the board spends moving the batch to and from
  // chip 0 beside the nodes (the bundled MLP on v3-8: the gather's wait was most
  // of its softmax's row).
  int io_in_op = 0;
  for (const Node& n : rg.graph.nodes) io_in_op = std::max(io_in_op, n.id + 1);
  for (const Node& n : g.nodes) io_in_op = std::max(io_in_op, n.id + 1);
  const int io_out_op = io_in_op + 1;
  auto bytes_of = [](const isa::IoEntry& e) { return static_cast<int64_t>(e.elements() * isa::dtype_size(e.dtype)); };
  auto endpoint = [&](int r) {
    return "hbm@chip" + std::to_string(replica_chip(s, r)) + ".c" + std::to_string(replica_core(s, r));
  };

  std::ostringstream text;
  std::vector<std::string> notes;  // every replica's, once
  const isa::Target& t = options.target;
  text << ".target chips=" << chips << " cores=" << cores << " mxus=" << t.mxus_per_core << " mxu_rows=" << t.mxu_rows
       << " mxu_cols=" << t.mxu_cols << " fifo_rows=" << t.fifo_rows << " vmem=" << t.vmem_bytes
       << " smem=" << t.smem_bytes << " hbm=" << t.hbm_bytes << " host=" << t.host_bytes << "\n";
  for (int r = 0; r < R; ++r) {
    lo.replica = r;
    lo.hbm_base = replica_core(s, r) * region;
    lo.replica_region = region;
    const LowerResult mine = lowering::Emitter(rg.graph, lo).run();
    for (const std::string& note : mine.notes)
      if (std::find(notes.begin(), notes.end(), note) == notes.end()) notes.push_back(note);
    // The collectives address other replicas' tensors at their offset in this one.
    if (mine.hbm_end - lo.hbm_base != first.hbm_end)
      throw CompileError(g.name + ": internal lowering error: replica " + std::to_string(r) + "'s HBM plan differs from replica 0's");
    std::map<std::string, const isa::IoEntry*> at;
    for (const auto& e : mine.bundle.io) at[e.name] = &e;
    for (const auto& e : mine.bundle.io) {
      if (e.kind != isa::IoKind::kConst) continue;
      isa::IoEntry c = e;
      c.name = e.name + "@chip" + std::to_string(replica_chip(s, r)) + ".core" + std::to_string(replica_core(s, r));
      c.chip = static_cast<uint32_t>(replica_chip(s, r));
      io.push_back(std::move(c));
    }
    text << ".core chip" << replica_chip(s, r) << ".core" << replica_core(s, r) << "\n"
         << (top > INT32_MAX ? lowering::window_setup() : "") << "  op " << io_in_op << "\n";
    int issued = 0;
    if (infeed) {
      issued += host_infeed_prologue(text, g, rg, s, r, at, host_at, lo.hbm_base, region);
    } else if (r == 0) {
      // Chip 0 pushes every replica its slice of each batched input and a copy of the others.
      for (const auto& in : g.inputs) {
        const isa::IoEntry& e = *at.at(in.name);
        const int64_t slice = bytes_of(e);
        for (int q = 0; q < R; ++q) {
          const int64_t src = global.at(in.name) + (rg.batched_inputs.count(in.name) ? q * slice : 0);
          const int64_t dst = static_cast<int64_t>(e.addr) - lo.hbm_base + replica_core(s, q) * region;
          text << "  dma " << endpoint(q) << ":" << lowering::addr_ref(dst) << ", hbm:" << lowering::addr_ref(src) << ", bytes=" << slice
               << ", flag=" << kIoIssue << ", rflag=" << kInLanded << "\n";
          ++issued;
        }
      }
    }
    if (!infeed) text << "  wait " << kInLanded << ", " << g.inputs.size() << "\n";
    const auto [code, streams] = core_code(mine.assembly);
    text << code;
    // Without batched outputs nothing is gathered: replica 0's wait for its scatter
    // stays the scatter's.
    text << "  op " << (rg.batched_outputs.empty() ? io_in_op : io_out_op) << "\n";
    int gathered = 0;
    for (const auto& o : g.outputs) {
      if (!rg.batched_outputs.count(o)) continue;
      const isa::IoEntry& e = *at.at(o);
      text << "  dma hbm@chip0.c0:" << lowering::addr_ref(global.at(o) + r * bytes_of(e)) << ", hbm:"
           << lowering::addr_ref(static_cast<int64_t>(e.addr)) << ", bytes=" << bytes_of(e) << ", flag=" << kIoIssue << ", rflag=" << kOutLanded << "\n";
      ++issued;
      ++gathered;
    }
    if (issued) text << "  wait " << kIoIssue << ", " << issued << "\n";
    if (r == 0 && gathered) text << "  wait " << kOutLanded << ", " << gathered * R << "\n";
    text << "  halt\n" << streams;
    if (r == 0)
      for (const auto& o : g.outputs)
        if (!rg.batched_outputs.count(o)) {
          isa::IoEntry e = *at.at(o);  // identical on every replica: replica 0's
          e.kind = isa::IoKind::kOutput;
          io.push_back(e);
        }
  }

  LowerResult res;
  res.assembly = text.str();
  try {
    res.bundle = isa::assemble(res.assembly, g.name + ".s");
  } catch (const isa::AsmError& e) {
    throw CompileError(std::string("internal lowering error: ") + e.what());
  }
  res.bundle.io = std::move(io);
  // Named after the fused replica graph (a conv's relu in its name, as lower_graph's).
  res.bundle.op_names[io_in_op] = infeed ? "infeed: inputs from the host" : "scatter: inputs from chip 0";
  if (!rg.batched_outputs.empty()) res.bundle.op_names[io_out_op] = "gather: outputs to chip 0";
  record_op_names(res.bundle, rg.graph, first.fused);
  res.hbm_end = top;
  res.hbm_unplanned = first.hbm_unplanned;
  res.notes = notes;
  const std::string bad = isa::check_bundle(res.bundle);
  if (!bad.empty()) throw CompileError(g.name + ": internal lowering error: " + bad);
  return res;
}

}  // namespace tpusim::compiler
