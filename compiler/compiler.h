// The compiler's library API, as the CLI calls it (`tpusim ref MODEL`,
// `tpusim compile MODEL`):
//
//   Graph g = tpusim::compiler::load_model("resnet18.onnx");      // or IR text
//   auto outs = tpusim::compiler::evaluate(g, inputs, num::PrecisionPolicy::kDefault);
//
// Every failure is a CompileError whose what() is one line naming the file and,
// where there is one, the node/line and the problem (the CLI exits 2 on it).
#pragma once

#include <string>

#include "compiler/ir/graph.h"
#include "compiler/onnx/import.h"
#include "compiler/passes/passes.h"
#include "compiler/ref/evaluate.h"

namespace tpusim::compiler {

// A path ending in ".onnx" is imported as ONNX (import_onnx_file, which runs
// import_pipeline); anything else is read as graph IR text and verified. The
// result is verified.
Graph load_model(const std::string& path);

}  // namespace tpusim::compiler
