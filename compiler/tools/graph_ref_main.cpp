// tpusim-graph-ref: the graph reference evaluator on .npy files.
//   tpusim-graph-ref MODEL [--policy default|bf16] [--rows R] [--out DIR] [--print-ir]
//                    [--pass NAME]... [NAME=FILE.npy]...
// Writes DIR/<output>.npy (float32; bf16 results widened exactly). Exit 2 with one
// line on stderr for any bad model or input.
#include <cstdio>
#include <cstring>
#include <string>
#include <vector>

#include "compiler/compiler.h"
#include "isa/io/npy.h"

using namespace tpusim;
using namespace tpusim::compiler;

int main(int argc, char** argv) {
  try {
    std::string model, out = "tpusim-out";
    num::PrecisionPolicy policy = num::PrecisionPolicy::kDefault;
    EvalOptions opt;
    bool print_ir = false;
    std::vector<std::string> passes;
    std::vector<std::pair<std::string, std::string>> inputs;
    for (int i = 1; i < argc; ++i) {
      const std::string a = argv[i];
      auto next = [&]() -> std::string {
        if (i + 1 >= argc) throw CompileError(a + " needs a value");
        return argv[++i];
      };
      if (a == "--policy") {
        const auto p = num::parse_precision_policy(next());
        if (!p) throw CompileError("--policy must be default or bf16");
        policy = *p;
      } else if (a == "--rows") {
        opt.mxu_rows = std::stoi(next());
      } else if (a == "--out") {
        out = next();
      } else if (a == "--print-ir") {
        print_ir = true;
      } else if (a == "--pass") {
        passes.push_back(next());
      } else if (a.find('=') != std::string::npos) {
        inputs.emplace_back(a.substr(0, a.find('=')), a.substr(a.find('=') + 1));
      } else if (model.empty()) {
        model = a;
      } else {
        throw CompileError("unexpected argument '" + a + "'");
      }
    }
    if (model.empty()) throw CompileError("usage: tpusim-graph-ref MODEL [--policy P] [--out DIR] NAME=FILE.npy...");
    Graph g = load_model(model);
    std::vector<Pass> ps;
    for (const auto& p : passes) ps.push_back(pass_by_name(p));
    run_passes(g, ps);
    if (print_ir) {
      std::fputs(print_graph(g).c_str(), stdout);
      if (inputs.empty()) return 0;
    }
    std::map<std::string, HostTensor> in;
    for (const auto& [name, path] : inputs) {
      const io::NpyArray a = io::read_npy(path);
      HostTensor t;
      t.shape.assign(a.shape.begin(), a.shape.end());
      const size_t n = a.elements();
      if (a.dtype == io::NpyDtype::kF32) {
        t.f.assign(a.as<float>(), a.as<float>() + n);
      } else if (a.dtype == io::NpyDtype::kI64) {
        t.dtype = DType::kI64;
        t.i.assign(a.as<int64_t>(), a.as<int64_t>() + n);
      } else if (a.dtype == io::NpyDtype::kI32) {
        t.dtype = DType::kI64;
        t.i.assign(a.as<int32_t>(), a.as<int32_t>() + n);
      } else {
        throw CompileError(path + ": input must be float32, int32 or int64");
      }
      in[name] = std::move(t);
    }
    const auto res = evaluate(g, in, policy, opt);
    for (const auto& [name, t] : res) {
      io::NpyArray a;
      a.dtype = io::NpyDtype::kF32;
      a.shape.assign(t.shape.begin(), t.shape.end());
      a.data.resize(t.f.size() * 4);
      std::memcpy(a.data.data(), t.f.data(), a.data.size());
      std::string file;
      for (char c : name) file += (std::isalnum(static_cast<unsigned char>(c)) || c == '_' || c == '.' || c == '-') ? c : '_';
      io::write_npy(out + "/" + file + ".npy", a);
    }
    return 0;
  } catch (const std::exception& e) {
    std::fprintf(stderr, "tpusim-graph-ref: %s\n", e.what());
    return 2;
  }
}
