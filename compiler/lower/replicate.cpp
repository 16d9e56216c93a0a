// Data-parallel lowering (docs/codegen.md "Boards and replicas"): the per-replica
// graph lowered once per replica onto the cores of the board's chips. The I/O table splits the
// global batch (and the batched outputs) over the replicas' own memories and copies
// an unbatched input to each, as a framework's sharded arrays sit on their devices.
#include <algorithm>
#include <map>
#include <set>
#include <sstream>
#include <string>
#include <vector>

#include "compiler/lower/emitter.h"
#include "compiler/lower/vmem_plan.h"
#include "compiler/passes/passes.h"
#include "isa/asm/assembler.h"

namespace tpusim::compiler {

namespace {
// Flags of the infeed prologue, apart from the node lowerings' and the
// collectives' (collective.cpp, f20..f58).
constexpr const char* kInLanded = "f61";  // this replica's inputs have landed (another core's infeed)
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
// DMAs' rflag, which the host link counts as infeed too. Each chip's host memory
// holds its replicas' rows of a batched input, in replica order, and a copy of an
// unbatched one, at the same addresses on every chip (the I/O table's places).
void host_infeed_prologue(std::ostringstream& text, const Graph& g, const ReplicaGraph& rg, const ReplicaSpec& s,
                          int r, const std::map<std::string, const isa::IoEntry*>& at,
                          const std::map<std::string, int64_t>& host_at, int64_t hbm_base, int64_t region) {
  const int R = s.replicas;
  const int chip = replica_chip(s, r), core = replica_core(s, r);
  auto bytes_of = [](const isa::IoEntry& e) { return static_cast<int64_t>(e.elements() * isa::dtype_size(e.dtype)); };
  const int64_t inputs = static_cast<int64_t>(g.inputs.size());
  if (core != 0) {
    text << "  wait " << kInLanded << ", " << inputs << "\n";  // the rflags of core 0's infeed
    return;
  }
  int n = 0;  // the chip's replicas
  for (int q = 0; q < R; ++q) n += replica_chip(s, q) == chip;
  for (const auto& in : g.inputs) {
    const isa::IoEntry& e = *at.at(in.name);
    const int64_t slice = bytes_of(e);
    const bool batched = rg.batched_inputs.count(in.name) != 0;
    const int64_t src = host_at.at(in.name);
    const int64_t dst = static_cast<int64_t>(e.addr) - hbm_base;  // core 0's region starts at 0
    // One DMA per core (one over both cores' regions would overlap the next
    // input's in the race checker's bounding ranges); core k's rflag rises with it.
    for (int k = 0; k < n; ++k)
      text << "  dma hbm" << (k ? "@c" + std::to_string(k) : std::string()) << ":" << lowering::addr_ref(dst + k * region)
           << ", host:" << lowering::addr_ref(src + (batched ? k * slice : 0)) << ", bytes=" << slice << ", flag=" << kInfeed
           << (k ? std::string(", rflag=") + kInLanded : std::string()) << "\n";
  }
  text << "  wait " << kInfeed << ", " << inputs * n << "\n";
}

// Early entry tokens. A streamed all_reduce's first piece on each slot waits for
// its receiver's entry token, sent when the receiver enters the op: up to a
// neighbour latency (1,941 cycles) at the start of every all_reduce, half of what
// a small one took over its closed form (v3-8 1 KiB: 10,776 cycles against 8,599;
// 9,806 with the tokens sent early). The token only says the
// slot is free; the slots sit at the top of VMEM (collective.cpp), and no op
// before the first collective uses the collectives' flags, so the tokens may go
// as soon as no op before the all_reduce touches the slots' bytes: at the start
// of the op after the last one whose VMEM plan reaches them (the program's first
// op when none does). Only the program's first collective, and only ops of stream
// 0 that no forked stream runs: a later collective's slots and flags are the
// earlier one's until it ends. `code` is one replica's stream 0 and `streams`
// its forked streams' code; `vmem` each op's VMEM byte ranges (record_vmem_plan,
// the same for every replica); `slots` LowerResult::entry_token_slots.
std::string send_entry_tokens_early(const std::string& code, const std::string& streams,
                                    const std::map<int, std::vector<std::pair<uint64_t, uint64_t>>>& vmem,
                                    const std::map<int, int64_t>& slots) {
  std::vector<std::string> lines;
  for (size_t at = 0; at < code.size();) {
    const size_t end = code.find('\n', at);
    lines.push_back(code.substr(at, end - at));
    at = end == std::string::npos ? code.size() : end + 1;
  }
  auto op_of = [](const std::string& l) { return l.rfind("  op ", 0) == 0 ? std::stoi(l.substr(5)) : -1; };
  std::set<int> forked;  // ops with code in another stream
  for (size_t at = streams.find("\n  op "); at != std::string::npos; at = streams.find("\n  op ", at + 1))
    forked.insert(std::stoi(streams.substr(at + 6)));
  // The first op with tokens, and where its tokens are.
  const auto tagged = std::find_if(lines.begin(), lines.end(),
                                   [](const std::string& l) { return l.find(kEntryTokenTag) != std::string::npos; });
  if (tagged == lines.end()) return code;
  size_t op_line = static_cast<size_t>(tagged - lines.begin());  // back to the all_reduce's op line
  while (op_line > 0 && op_of(lines[op_line]) < 0) --op_line;
  const int ar = op_of(lines[op_line]);
  if (ar < 0 || !slots.count(ar)) return code;
  const uint64_t lo = static_cast<uint64_t>(slots.at(ar));
  // The first op line of the last run of ops before the all_reduce that leave the
  // slots alone (no VMEM byte at or above them, no forked code, no remote DMA).
  size_t after = SIZE_MAX;
  for (size_t i = 0; i < op_line; ++i) {
    const int op = op_of(lines[i]);
    bool touches = op < 0 && lines[i].find("rflag=") != std::string::npos;
    if (op >= 0) {
      touches = forked.count(op) != 0;
      const auto it = vmem.find(op);
      if (it != vmem.end())
        for (const auto& range : it->second) touches |= range.second > lo;
    }
    if (touches) after = SIZE_MAX;
    else if (op >= 0 && after == SIZE_MAX) after = i;
  }
  if (after == SIZE_MAX) return code;  // the op before the all_reduce reaches them: no earlier
  size_t next_op = op_line + 1;
  while (next_op < lines.size() && op_of(lines[next_op]) < 0) ++next_op;
  auto is_token = [&](size_t i) { return i > op_line && i < next_op && lines[i].find(kEntryTokenTag) != std::string::npos; };
  std::string out;
  for (size_t i = 0; i < lines.size(); ++i) {
    if (is_token(i)) continue;
    out += lines[i] + "\n";
    if (i == after)
      for (size_t t = op_line + 1; t < next_op; ++t)
        if (is_token(t)) out += lines[t] + "\n";
  }
  return out;
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

  // Every replica's inputs and outputs sit in its own region: a batched tensor is
  // split over the replicas in replica order, an unbatched input copied to each
  // (the I/O table's places), so no replica waits for another's bytes before it
  // starts, as on a board whose devices hold their shards.
  std::vector<isa::IoEntry> io;
  const int64_t top = cores * region;
  auto spread_over_replicas = [&](const isa::IoEntry& local_entry, isa::IoKind kind, const TensorType& t,
                                  bool batched) {
    isa::IoEntry e = local_entry;
    e.kind = kind;
    e.shape = t.shape;
    std::vector<isa::IoPlace> places;
    for (int r = 0; r < R; ++r)
      places.push_back({isa::Space::kHbm, static_cast<uint32_t>(replica_chip(s, r)),
                        static_cast<uint32_t>(replica_core(s, r)),
                        local_entry.addr + static_cast<uint64_t>(replica_core(s, r) * region)});
    e.set_places(places, batched ? isa::IoSpread::kSplit : isa::IoSpread::kCopies);
    io.push_back(std::move(e));
  };
  const auto types = g.types();
  // Host infeed: the inputs are in each chip's host memory instead, at the same
  // addresses on every chip: a batched input's rows of the chip's replicas, in
  // replica order (the chip's cores in turn, as host_infeed_prologue reads them),
  // an unbatched one whole.
  const bool infeed = options.inputs_from_host;
  std::map<std::string, int64_t> host_at;
  int64_t host_top = 0;
  for (const auto& in : g.inputs) {
    const bool batched = rg.batched_inputs.count(in.name) != 0;
    if (!infeed) {
      spread_over_replicas(*local.at(in.name), isa::IoKind::kInput, in.type, batched);
      continue;
    }
    isa::IoEntry h = *local.at(in.name);
    h.kind = isa::IoKind::kInput;
    h.shape = in.type.shape;
    h.space = isa::Space::kHost;
    const int64_t slice = static_cast<int64_t>(local.at(in.name)->elements() * isa::dtype_size(h.dtype));
    std::vector<isa::IoPlace> places;
    for (int r = 0; r < R; ++r)
      if (batched || replica_core(s, r) == 0)
        places.push_back({isa::Space::kHost, static_cast<uint32_t>(replica_chip(s, r)), 0,
                          static_cast<uint64_t>(host_top + (batched ? replica_core(s, r) * slice : 0))});
    h.set_places(places, batched ? isa::IoSpread::kSplit : isa::IoSpread::kCopies);
    io.push_back(std::move(h));
    host_at[in.name] = host_top;
    host_top = lowering::align_up(host_top + (batched ? cores : 1) * slice, lowering::kAlign);
  }
  if (static_cast<uint64_t>(host_top) > options.target.host_bytes || host_top > INT32_MAX)
    throw CompileError(g.name + ": the inputs need " + std::to_string(host_top) + " bytes of host memory, the target has " +
                       std::to_string(std::min<uint64_t>(options.target.host_bytes, INT32_MAX)));
  // An unbatched output (a step's updated weights) is a copy on every replica, so
  // reading it checks that the replicas agree (exec::copies_disagree).
  for (const auto& o : g.outputs)
    spread_over_replicas(*local.at(o), isa::IoKind::kOutput, types.at(o), rg.batched_outputs.count(o) != 0);
  if (top > lowering::kAddrReach)
    throw CompileError(g.name + ": " + std::to_string(cores) + " replicas a chip need " + std::to_string(top) +
                       " bytes of HBM; [sA + imm] addresses reach " + std::to_string(lowering::kAddrReach));
  if (static_cast<uint64_t>(top) > options.target.hbm_bytes)
    throw CompileError(g.name + ": needs " + std::to_string(top) + " bytes of HBM a chip, the target has " +
                       std::to_string(options.target.hbm_bytes));

  // The infeed is an op of its own, after the graph's ids, so a profile shows what
  // the board spends waiting for its hosts beside the nodes.
  int io_in_op = 0;
  for (const Node& n : rg.graph.nodes) io_in_op = std::max(io_in_op, n.id + 1);
  for (const Node& n : g.nodes) io_in_op = std::max(io_in_op, n.id + 1);

  // Each op's VMEM byte ranges, the same on every replica, for the early entry
  // tokens (read off replica 0's program, assembled alone).
  std::map<int, std::vector<std::pair<uint64_t, uint64_t>>> vmem_of_op;
  const bool early_tokens = !first.entry_token_slots.empty();
  if (early_tokens) {
    isa::Bundle alone;
    try {
      alone = isa::assemble(first.assembly, g.name + ".s");
    } catch (const isa::AsmError& e) {
      throw CompileError(std::string("internal lowering error: ") + e.what());
    }
    record_vmem_plan(alone);
    for (const isa::VmemBuffer& v : alone.cores.at(0).vmem_plan) vmem_of_op[v.op_id].emplace_back(v.addr, v.addr + v.bytes);
  }

  std::ostringstream text;
  std::vector<std::string> notes;  // every replica's, once
  std::map<std::string, std::vector<isa::IoPlace>> const_places;  // every replica's copy, in replica order
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
    // A constant (folded weights, masks) is the graph's, the same on every replica:
    // one entry with a copy at each replica's address of it.
    for (const auto& e : mine.bundle.io) {
      if (e.kind != isa::IoKind::kConst) continue;
      const isa::IoEntry& mine0 = *local.at(e.name);
      if (e.data != mine0.data || e.addr - static_cast<uint64_t>(lo.hbm_base) != mine0.addr)
        throw CompileError(g.name + ": internal lowering error: constant " + e.name + " of replica " +
                           std::to_string(r) + " differs from replica 0's");
      const_places[e.name].push_back({e.space, static_cast<uint32_t>(replica_chip(s, r)),
                                      static_cast<uint32_t>(replica_core(s, r)), e.addr});
    }
    text << ".core chip" << replica_chip(s, r) << ".core" << replica_core(s, r) << "\n"
         << (top > INT32_MAX ? lowering::window_setup() : "");
    if (infeed) {
      text << "  op " << io_in_op << "\n";
      host_infeed_prologue(text, g, rg, s, r, at, host_at, lo.hbm_base, region);
    }
    const auto [code, streams] = core_code(mine.assembly);
    text << (!early_tokens ? code : send_entry_tokens_early(code, streams, vmem_of_op, mine.entry_token_slots));
    text << "  halt\n" << streams;
  }
  for (const auto& e : first.bundle.io)
    if (e.kind == isa::IoKind::kConst) {
      isa::IoEntry c = e;
      c.set_places(const_places.at(e.name), isa::IoSpread::kCopies);
      io.push_back(std::move(c));
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
  if (infeed) res.bundle.op_names[io_in_op] = "infeed: inputs from the host";
  record_op_names(res.bundle, rg.graph, first.fused);
  res.hbm_end = top;
  res.hbm_unplanned = first.hbm_unplanned;
  res.notes = notes;
  const std::string bad = isa::check_bundle(res.bundle);
  if (!bad.empty()) throw CompileError(g.name + ": internal lowering error: " + bad);
  return res;
}

}  // namespace tpusim::compiler
