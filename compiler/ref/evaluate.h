// The graph reference evaluator: computes every op of a graph per the numerics
// contract (shared/spec/numerics.md), independent of tiling and scheduling. The
// exact sequence of num:: operations per op is written down in docs/compiler.md
// ("Op recipes"); compiled code must reproduce these results bit for bit.
#pragma once

#include <map>
#include <string>
#include <vector>

#include "compiler/ir/graph.h"
#include "isa/numerics/precision.h"

namespace tpusim::compiler {

// A tensor on the host: f32/bf16 values in `f` (bf16 values are fp32 numbers that
// are exactly representable in bf16), i64 values in `i`.
struct HostTensor {
  DType dtype = DType::kF32;
  Shape shape;
  std::vector<float> f;
  std::vector<int64_t> i;
};

struct EvalOptions {
  int mxu_rows = 128;  // R: the reduction chunk length of matmul and conv
};

// Evaluates `g` under `policy` (apply_precision is run on a copy first). Every
// graph input must be given with its declared shape; float inputs may be given as
// f32 and are rounded to the input's dtype; i64 inputs as i64. Returns every graph
// output by name. Throws CompileError for a missing/mis-shaped input or an index
// out of range.
std::map<std::string, HostTensor> evaluate(const Graph& g, const std::map<std::string, HostTensor>& inputs,
                                           num::PrecisionPolicy policy, const EvalOptions& options = {});

struct ReplicaSpec;  // compiler/ref/replicas.h
// Data-parallel evaluation (docs/codegen.md "Boards and replicas"): the graph's batched inputs
// are split along axis 0 over spec.replicas replicas, every replica evaluates the
// per-replica graph node by node in lockstep, and each all_reduce sums the replicas'
// operands in the add order of its collective schedule. Batched outputs are the
// replicas' results concatenated along axis 0, the others replica 0's. One replica:
// evaluate().
std::map<std::string, HostTensor> evaluate_replicated(const Graph& g, const std::map<std::string, HostTensor>& inputs,
                                                      num::PrecisionPolicy policy, const ReplicaSpec& spec,
                                                      const EvalOptions& options = {});

}  // namespace tpusim::compiler
