// core_run: runs one program on the SystemC chip model (one elaboration per
// process, so tests spawn it once per mode) and on the functional reference, and
// writes both results as JSON: cycles, fault, per-unit counters and the outputs'
// bytes (hex) from each.
// Usage: core_run PROG.s PRESET fast|detailed OUT.json [NAME=FILE.npy]... [--set K=V]... [--wave F.vcd]
#include <fmt/core.h>

#include <cstdio>
#include <fstream>
#include <iostream>
#include <systemc>

#include "hw/config/params.h"
#include "hw/mxu/result_values.h"
#include "hw/timeline/timeline.h"
#include "hw/system/system.h"
#include "isa/asm/assembler.h"
#include "isa/exec/interpreter.h"
#include "isa/exec/tensors.h"
#include "isa/io/npy.h"

namespace {

std::string hex(const std::vector<uint8_t>& b) {
  static const char* d = "0123456789abcdef";
  std::string s;
  s.reserve(b.size() * 2);
  for (uint8_t x : b) {
    s += d[x >> 4];
    s += d[x & 15];
  }
  return s;
}

}  // namespace

int sc_main(int argc, char** argv) {
  using namespace tpusim;
  if (argc < 5) {
    std::cerr << "usage: core_run PROG.s PRESET fast|detailed OUT.json [NAME=FILE.npy]... [--set K=V]...\n";
    return 2;
  }
  try {
    const isa::Bundle bundle = isa::assemble_file(argv[1]);
    std::vector<std::string> sets;
    std::vector<std::pair<std::string, std::string>> inputs;
    hw::RunOptions opt;
    std::string timeline_path;
    opt.mode = std::string(argv[3]) == "detailed" ? hw::Mode::kDetailed : hw::Mode::kFast;
    for (int i = 5; i < argc; ++i) {
      const std::string a = argv[i];
      if (a == "--set" && i + 1 < argc) {
        sets.push_back(argv[++i]);
      } else if (a == "--wave" && i + 1 < argc) {
        opt.wave_path = argv[++i];
      } else if (a == "--scope" && i + 1 < argc) {
        opt.wave_scopes.push_back(argv[++i]);
      } else if (a == "--timeline" && i + 1 < argc) {
        timeline_path = argv[++i];
      } else if (a == "--max-instructions" && i + 1 < argc) {
        opt.max_instructions = std::stoull(argv[++i]);
      } else if (a == "--no-windows") {
        opt.windows = false;
      } else if (a == "--threads" && i + 1 < argc) {  // as tpusim run --threads
        hw::mxu::set_matmul_threads(std::stoi(argv[++i]));
      } else if (a == "--max-cycles" && i + 1 < argc) {
        opt.max_cycles = std::stoull(argv[++i]);
      } else {
        const auto eq = a.find('=');
        inputs.push_back({a.substr(0, eq), a.substr(eq + 1)});
      }
    }
    const config::Params preset = config::load_preset(argv[2], sets);
    hw::System sys(preset, bundle);
    exec::Interpreter ref(bundle);
    for (const auto& e : bundle.io) {
      if (e.kind != isa::IoKind::kInput) continue;
      std::vector<uint8_t> dense;
      bool found = false;
      for (const auto& [n, f] : inputs)
        if (n == e.name) {
          dense = exec::tensor_from_npy(io::read_npy(f), e);
          found = true;
        }
      if (!found) dense = exec::random_tensor(e, 1);
      exec::write_tensor(sys.machine(), e, dense);
      exec::write_tensor(ref.machine(), e, dense);
    }
    exec::RunOptions ro;
    ro.max_instructions = opt.max_instructions;
    const exec::RunResult rr = ref.run(ro);
    std::unique_ptr<timeline::Timeline> tl;
    if (!timeline_path.empty()) {
      timeline::Options to;
      to.clock_hz = preset.get_double("clock_hz");
      tl = std::make_unique<timeline::Timeline>(to);
      opt.timeline = tl.get();
    }
    const hw::RunResult r = sys.run(opt);
    if (tl) tl->write(timeline_path);
    nlohmann::json j;
    j["cycles"] = r.cycles;
    j["faulted"] = r.faulted;
    j["fault"] = r.fault;
    j["units"] = r.units;
    j["flops"] = r.flops;
    j["hbm_bytes_read"] = r.hbm_bytes_read;
    j["hbm_bytes_written"] = r.hbm_bytes_written;
    j["ref_ok"] = rr.ok();
    j["ref_message"] = rr.message;
    for (const auto& e : bundle.io) {
      if (e.kind != isa::IoKind::kOutput) continue;
      j["outputs"][e.name] = hex(exec::read_tensor(sys.machine(), e));
      j["ref_outputs"][e.name] = hex(exec::read_tensor(ref.machine(), e));
    }
    std::ofstream(argv[4]) << j.dump(1) << "\n";
    return 0;
  } catch (const std::exception& e) {
    std::cerr << "core_run: " << e.what() << "\n";
    return 2;
  }
}
