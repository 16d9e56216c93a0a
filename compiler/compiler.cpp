#include "compiler/compiler.h"

#include <cerrno>
#include <cstring>
#include <fstream>
#include <sstream>

namespace tpusim::compiler {

Graph load_model(const std::string& path) {
  if (path.size() >= 5 && path.compare(path.size() - 5, 5, ".onnx") == 0) return import_onnx_file(path);
  std::ifstream f(path, std::ios::binary);
  if (!f) throw CompileError(path + ": cannot open: " + std::strerror(errno));
  std::ostringstream ss;
  ss << f.rdbuf();
  Graph g = parse_graph(ss.str(), path);
  verify(g, path);
  return g;
}

}  // namespace tpusim::compiler
