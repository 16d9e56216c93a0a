#include "compiler/compiler.h"

#include <cerrno>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <sstream>

namespace tpusim::compiler {

Graph load_model(const std::string& path) {
  if (path.size() >= 5 && path.compare(path.size() - 5, 5, ".onnx") == 0) return import_onnx_file(path);
  if (std::filesystem::is_directory(path)) throw CompileError(path + ": is a directory, not a model file");
  std::ifstream f(path, std::ios::binary);
  if (!f) throw CompileError(path + ": cannot open: " + std::strerror(errno));
  std::ostringstream ss;
  ss << f.rdbuf();
  Graph g = parse_graph(ss.str(), path);
  verify(g, path);
  return g;
}

}  // namespace tpusim::compiler
