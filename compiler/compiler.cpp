#include "compiler/compiler.h"

#include <cerrno>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <sstream>

namespace tpusim::compiler {

Graph load_model(const std::string& path) {
  // One read for both forms: .onnx goes to the importer, anything else is graph IR text.
  const bool onnx = path.size() >= 5 && path.compare(path.size() - 5, 5, ".onnx") == 0;
  if (std::filesystem::is_directory(path))
    throw CompileError(path + ": is a directory, not " + (onnx ? "an ONNX model" : "a model file"));
  std::ifstream f(path, std::ios::binary);
  if (!f) throw CompileError(path + ": cannot open: " + std::strerror(errno));
  std::ostringstream ss;
  ss << f.rdbuf();
  if (onnx) return import_onnx_bytes(ss.str(), path);
  Graph g = parse_graph(ss.str(), path);
  verify(g, path);
  return g;
}

}  // namespace tpusim::compiler
