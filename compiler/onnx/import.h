// ONNX import (Debian's libonnx protobuf classes): float32 models at opsets 11-17
// with static shapes. The result is canonicalised by import_pipeline() (decomposed
// layernorm and gelu fused back, batchnorm folded into conv, dead code removed) and
// verified.
#pragma once

#include <string>
#include <vector>

#include "compiler/ir/graph.h"

namespace tpusim::compiler {

// Throws CompileError "<label>: <problem>" for a corrupt or truncated file, an
// unsupported opset, op or attribute (naming the node and op), a cycle, or shapes
// that do not fit.
Graph import_onnx_bytes(const std::string& bytes, const std::string& label);

}  // namespace tpusim::compiler
