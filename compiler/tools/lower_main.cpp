// tpusim-lower MODEL -o BUNDLE --mxus N --rows R --cols C --fifo-rows F --vmem BYTES
//              [--hbm BYTES] [--smem BYTES] [--cores N] [--precision default|bf16] [--no-fuse]
// The lowering with its options spelled out, for scripts/perf_table.py: --no-fuse
// lowers every node on its own, so what fusion saves in HBM traffic can be measured
// (`tpusim compile` always fuses). Bad input: one line on stderr, exit 2.
#include <cstdio>
#include <cstdlib>
#include <stdexcept>
#include <string>

#include "compiler/compiler.h"
#include "compiler/lower/lower.h"
#include "isa/bundle/bundle_file.h"

int main(int argc, char** argv) {
  using namespace tpusim;
  try {
    std::string model, out;
    compiler::LowerOptions lo;
    lo.target.hbm_bytes = 16ull << 30;
    for (int i = 1; i < argc; ++i) {
      const std::string a = argv[i];
      auto next = [&]() -> std::string {
        if (i + 1 >= argc) throw std::runtime_error(a + " needs a value");
        return argv[++i];
      };
      auto num = [&]() { return std::stoull(next()); };
      if (a == "-o") out = next();
      else if (a == "--mxus") lo.target.mxus_per_core = static_cast<uint32_t>(num());
      else if (a == "--rows") lo.target.mxu_rows = static_cast<uint32_t>(num());
      else if (a == "--cols") lo.target.mxu_cols = static_cast<uint32_t>(num());
      else if (a == "--fifo-rows") lo.target.fifo_rows = static_cast<uint32_t>(num());
      else if (a == "--vmem") lo.target.vmem_bytes = num();
      else if (a == "--smem") lo.target.smem_bytes = num();
      else if (a == "--hbm") lo.target.hbm_bytes = num();
      else if (a == "--cores") lo.cores = static_cast<int>(num());
      else if (a == "--no-fuse") lo.fuse = false;
      else if (a == "--precision") {
        const auto p = num::parse_precision_policy(next());
        if (!p) throw std::runtime_error("--precision must be default or bf16");
        lo.policy = *p;
      } else if (!a.empty() && a[0] == '-') throw std::runtime_error("unknown option " + a);
      else model = a;
    }
    if (model.empty() || out.empty()) throw std::runtime_error("usage: tpusim-lower MODEL -o BUNDLE [options]");
    const compiler::LowerResult r = compiler::lower_graph(compiler::load_model(model), lo);
    isa::write_bundle(out, r.bundle);
    size_t n = 0;
    for (const auto& c : r.bundle.cores) n += c.code.size();
    std::printf("%s: %zu instructions -> %s\n", model.c_str(), n, out.c_str());
    return 0;
  } catch (const std::exception& e) {
    std::fprintf(stderr, "%s\n", e.what());
    return 2;
  }
}
