#include "sim/run/tensor_io.h"

#include <unistd.h>

#include <cerrno>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <set>

#include "isa/exec/tensors.h"

namespace tpusim::run {

namespace {

std::string input_names(const isa::Bundle& b) {
  std::string s;
  for (const auto& e : b.io)
    if (e.kind == isa::IoKind::kInput) s += (s.empty() ? "" : ", ") + e.name;
  return s.empty() ? "none" : s;
}

}  // namespace

std::map<std::string, std::vector<uint8_t>> bind_inputs(const isa::Bundle& bundle, const std::string& bundle_name,
                                                          const std::vector<std::string>& assignments,
                                                          std::optional<uint64_t> random_seed) {
  std::map<std::string, std::vector<uint8_t>> inputs;
  for (const auto& a : assignments) {
    const auto eq = a.find('=');
    if (eq == std::string::npos || eq == 0 || eq + 1 == a.size())
      throw UsageError("--input '" + a + "': expected NAME=FILE.npy");
    const std::string name = a.substr(0, eq), file = a.substr(eq + 1);
    const isa::IoEntry* entry = nullptr;
    for (const auto& e : bundle.io)
      if (e.name == name) entry = &e;
    if (!entry || entry->kind != isa::IoKind::kInput)
      throw UsageError("--input " + name + ": " + bundle_name + " has no input '" + name +
                       "' (its inputs: " + input_names(bundle) + ")");
    if (inputs.count(name)) throw UsageError("--input " + name + ": given twice");
    io::NpyArray arr;
    try {
      arr = io::read_npy(file);
    } catch (const io::NpyError& err) {
      throw UsageError(std::string("--input ") + name + ": " + err.what());
    }
    try {
      inputs.emplace(name, exec::tensor_from_npy(arr, *entry));
    } catch (const std::runtime_error& err) {
      throw UsageError(file + ": " + err.what());
    }
  }
  for (const auto& e : bundle.io) {
    if (e.kind != isa::IoKind::kInput || inputs.count(e.name)) continue;
    if (!random_seed)
      throw UsageError(bundle_name + ": missing input '" + e.name + "' (give --input " + e.name +
                       "=FILE.npy or --random-inputs SEED)");
    inputs.emplace(e.name, exec::random_tensor(e, *random_seed));
  }
  return inputs;
}

void prepare_out_dir(const std::string& dir) {
  std::error_code ec;
  std::filesystem::create_directories(dir, ec);
  if (ec) throw UsageError("--out " + dir + ": cannot create the directory: " + ec.message());
  if (!std::filesystem::is_directory(dir, ec)) throw UsageError("--out " + dir + ": not a directory");
  check_writable_file(dir + "/.tpusim-probe." + std::to_string(::getpid()), "--out " + dir);
}

void check_writable_file(const std::string& path, const std::string& what) {
  // An existing file is left alone: opening it for append proves writability
  // without truncating what a previous run left.
  const bool existed = std::filesystem::exists(path);
  std::FILE* f = std::fopen(path.c_str(), "ab");
  if (!f) throw UsageError(what + ": cannot write " + path + ": " + std::strerror(errno));
  std::fclose(f);
  if (!existed) std::remove(path.c_str());
}

std::string output_path(const std::string& dir, const isa::IoEntry& e) { return dir + "/" + e.name + ".npy"; }

void write_output(const std::string& dir, const isa::IoEntry& e, const std::vector<uint8_t>& dense, bool raw_bf16) {
  io::write_npy(output_path(dir, e), exec::tensor_to_npy(e, dense, raw_bf16));
}

}  // namespace tpusim::run
