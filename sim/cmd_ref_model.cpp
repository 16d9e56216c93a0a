// `tpusim ref MODEL` (an .onnx file or graph IR text): the graph reference
// evaluator of compiler/, independent of tiling and scheduling. Inputs and
// outputs follow the same .npy rules as a bundle's, and `--random-inputs SEED`
// draws the same values a compiled bundle's input of that name and shape gets,
// so `tpusim ref model.onnx` and `tpusim ref model.tpb` can be diffed directly.
#include <unistd.h>

#include <cstdio>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <map>
#include <new>
#include <string>
#include <vector>

#include "compiler/compiler.h"
#include "compiler/ref/replicas.h"
#include "hw/config/params.h"
#include "isa/exec/tensors.h"
#include "isa/io/npy.h"
#include "sim/commands.h"

namespace tpusim::cli {

bool is_model_path(const std::string& path) {
  const auto ext = std::filesystem::path(path).extension();
  if (ext == ".onnx") return true;
  // Anything that does not start with the bundle magic is read as graph IR text.
  std::ifstream in(path, std::ios::binary);
  char magic[7] = {};
  if (!in.read(magic, sizeof magic)) return false;  // let the bundle reader report it
  return std::memcmp(magic, "TPUSIMB", sizeof magic) != 0;
}

namespace {

compiler::HostTensor tensor_from_file(const std::string& name, const std::string& path,
                                      const compiler::TensorType& type) {
  const io::NpyArray a = io::read_npy(path);
  if (std::vector<int64_t>(a.shape.begin(), a.shape.end()) != type.shape)
    throw std::runtime_error(path + ": input '" + name + "' must have shape " + compiler::type_str(type));
  compiler::HostTensor t;
  t.shape = type.shape;
  const size_t n = a.elements();
  if (type.dtype == compiler::DType::kI64) {
    t.dtype = compiler::DType::kI64;
    if (a.dtype == io::NpyDtype::kI32)
      t.i.assign(a.as<int32_t>(), a.as<int32_t>() + n);
    else if (a.dtype == io::NpyDtype::kI64)
      t.i.assign(a.as<int64_t>(), a.as<int64_t>() + n);
    else
      throw std::runtime_error(path + ": input '" + name + "' holds indices: int32 or int64 expected");
  } else {
    if (a.dtype != io::NpyDtype::kF32) throw std::runtime_error(path + ": input '" + name + "' must be float32");
    t.f.assign(a.as<float>(), a.as<float>() + n);
  }
  return t;
}

// The bundle's random draw for an fp32 (or int32 index) input of this name and shape.
compiler::HostTensor random_input(const compiler::GraphInput& in, uint64_t seed) {
  isa::IoEntry e;
  e.name = in.name;
  e.shape = in.type.shape;
  e.dtype = in.type.dtype == compiler::DType::kI64 ? isa::Dtype::kI32 : isa::Dtype::kF32;
  const std::vector<uint8_t> bytes = exec::random_tensor(e, seed);
  compiler::HostTensor t;
  t.shape = in.type.shape;
  const size_t n = e.elements();
  if (in.type.dtype == compiler::DType::kI64) {
    t.dtype = compiler::DType::kI64;
    for (size_t i = 0; i < n; ++i) {
      int32_t v;
      std::memcpy(&v, bytes.data() + 4 * i, 4);
      t.i.push_back(v);
    }
  } else {
    t.f.resize(n);
    std::memcpy(t.f.data(), bytes.data(), 4 * n);
  }
  return t;
}

// Host memory the reference takes for the graph's tensors: it holds every one at
// once (fp32 and bf16 values as floats, indices as int64). Each tensor has at most
// 2^40 elements (the verifier's bound); the sum is a double.
double tensor_bytes(const compiler::Graph& g) {
  double bytes = 0;
  for (const auto& [name, type] : g.types())
    bytes += static_cast<double>(compiler::num_elements(type.shape)) * (type.dtype == compiler::DType::kI64 ? 8 : 4);
  return bytes;
}

}  // namespace

int run_model_reference(const ModelRefArgs& o) {
  std::map<std::string, compiler::HostTensor> outputs;
  try {
    const compiler::Graph g = compiler::load_model(o.model);
    // More than the machine has is refused up front: the allocations would succeed
    // (overcommit) and the kernel kill the process after minutes of paging (a 2^31-row
    // gather: 3 minutes, then SIGKILL).
    const double need = tensor_bytes(g);
    const double have = static_cast<double>(sysconf(_SC_PHYS_PAGES)) * static_cast<double>(sysconf(_SC_PAGESIZE));
    if (have > 0 && need > have) {
      char buf[160];
      std::snprintf(buf, sizeof buf, "%.1f GB of host memory for its tensors, more than this machine's %.1f GB",
                    need / 1e9, have / 1e9);
      throw std::runtime_error(o.model + ": the graph reference holds every tensor at once and needs " + buf);
    }
    std::map<std::string, std::string> files;
    for (const auto& s : o.inputs) {
      const size_t eq = s.find('=');
      if (eq == std::string::npos || eq == 0) throw std::runtime_error("--input expects NAME=FILE.npy, got '" + s + "'");
      files[s.substr(0, eq)] = s.substr(eq + 1);
    }
    for (const auto& f : files) {
      bool known = false;
      for (const auto& in : g.inputs) known |= in.name == f.first;
      if (!known) throw std::runtime_error("--input " + f.first + ": the model has no input of that name");
    }
    std::map<std::string, compiler::HostTensor> inputs;
    for (const auto& in : g.inputs) {
      auto it = files.find(in.name);
      if (it != files.end())
        inputs[in.name] = tensor_from_file(in.name, it->second, in.type);
      else if (o.seed >= 0)
        inputs[in.name] = random_input(in, static_cast<uint64_t>(o.seed));
      else
        throw std::runtime_error("missing input '" + in.name + "' (give --input " + in.name +
                                 "=FILE.npy or --random-inputs SEED)");
    }
    const auto policy = num::parse_precision_policy(o.precision);
    if (!policy) throw std::runtime_error("--precision must be default or bf16, not '" + o.precision + "'");
    compiler::EvalOptions eo;
    compiler::ReplicaSpec spec;  // one replica
    if (!o.preset.empty()) {
      const config::Params preset = config::load_preset(o.preset, o.sets);
      eo.mxu_rows = static_cast<int>(preset.get_int("core.mxu.rows"));
      spec = replica_spec(preset, o.rep);
    } else if (o.rep.replicas > 1 || !o.sets.empty()) {
      throw std::runtime_error(std::string(o.rep.replicas > 1 ? "--replicas" : "--set") +
                               " needs --preset: the board and the MXU rows fix the reference's add order");
    }
    outputs = naming_file<compiler::CompileError>(
        o.model, [&] { return compiler::evaluate_replicated(g, inputs, *policy, spec, eo); });
  } catch (const std::bad_alloc&) {
    // The reference holds every tensor of the graph at once, in host memory.
    print_error("tpusim ref: error: " + o.model +
                ": out of host memory (the graph reference holds every tensor of the graph at once)");
    return kExitBadInput;
  } catch (const std::exception& e) {
    print_error(std::string("tpusim ref: error: ") + e.what());
    return kExitBadInput;
  }
  try {
    std::filesystem::create_directories(o.out);
    for (const auto& [name, t] : outputs) {
      io::NpyArray a;
      a.dtype = io::NpyDtype::kF32;  // bf16 results are already widened exactly
      a.shape.assign(t.shape.begin(), t.shape.end());
      a.data.resize(t.f.size() * 4);
      std::memcpy(a.data.data(), t.f.data(), a.data.size());
      io::write_npy(o.out + "/" + name + ".npy", a);
    }
  } catch (const std::exception& e) {
    print_error(std::string("tpusim ref: error: writing outputs: ") + e.what());
    return kExitBadInput;
  }
  std::fprintf(stderr, "tpusim ref: graph reference, %zu output(s) in %s\n", outputs.size(), o.out.c_str());
  return kExitOk;
}

}  // namespace tpusim::cli
