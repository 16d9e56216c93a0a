// Graph-level passes that need no ISA. Each is small, named and testable alone on
// IR text (tests/compiler/passes_test.cpp); run_passes() runs the verifier after
// every one, so a pass that breaks the graph is caught where it happened.
#pragma once

#include <functional>
#include <string>
#include <vector>

#include "compiler/ir/graph.h"
#include "isa/numerics/precision.h"

namespace tpusim::compiler {

struct Pass {
  std::string name;
  std::function<void(Graph&)> run;
};

// Runs each pass, then verify(g, "after pass <name>").
void run_passes(Graph& g, const std::vector<Pass>& passes);

// Looks a pass up by its name ("fuse-layernorm", "fuse-gelu", "fold-batchnorm",
// "fuse-elementwise", "fold-identity", "dce", "precision-default", "precision-bf16"); throws
// CompileError for an unknown name.
Pass pass_by_name(const std::string& name);

// The passes that canonicalise an imported graph: fold-identity, fuse-layernorm, fuse-gelu,
// fold-batchnorm, dce.
std::vector<Pass> import_pipeline();

// `default`: nothing changes (fp32 tensors; the MXU rounds its operands itself).
// `bf16`: every f32 tensor (inputs, constants rounded to bf16, node results, cast
// targets) becomes bf16; i64 tensors stay.
void apply_precision(Graph& g, num::PrecisionPolicy policy);

// batchnorm(conv2d(x, w, b), scale, bias, mean, var) with constant parameters and a
// conv result used only there -> conv2d(x, w', b'), per output channel o:
//   s_o  = div(scale_o, sqrt(add(var_o, eps)))
//   w'   = mul(w[o,...], s_o)
//   b'_o = add(mul(sub(b_o, mean_o), s_o), bias_o)      (b_o = +0.0 without a bias)
// The conv keeps its id and takes the batchnorm's output name.
void fold_batchnorm(Graph& g);

// The decomposition exporters emit for LayerNormalization before opset 17:
//   m = reduce_mean(x, last); d = sub(x, m); v = reduce_mean(pow(d, 2) | mul(d, d));
//   y = add(mul(div(d, sqrt(add(v, eps))), gamma), beta)
// -> layernorm(x, gamma, beta) {axis, epsilon}. The fused op gets a fresh id.
void fuse_layernorm(Graph& g);

// torch's exact-erf GELU: mul(mul(x, add(erf(div(x, sqrt2)), 1)), 0.5) -> gelu(x).
void fuse_gelu(Graph& g);

// Marks fusion groups: an elementwise op whose operand is the only use (not a graph
// output) of the current end of a chain rooted at a matmul, conv2d or elementwise
// node joins that root's group (fusion_group = the root's id), so the lowering
// applies it to the root's output tiles in registers and only the chain's end is
// stored (an elementwise root's chain also goes on past a value other nodes read,
// storing it). Conditions: the root's output shape; a second operand that exists
// before the root runs (for conv2d, whose tiles are NHWC, a single element; for a
// conv with NCHW tiles, below, also one of its shape). In an elementwise root's
// chain that operand may instead be a feeder: an elementwise op of the root's shape
// read by that member alone, with no members of its own and operands that exist
// before the root runs; it joins the group too and the kernel computes it in
// registers (compiler/lower/fusion.cpp). A maxpool_grad takes one member, the
// relu_grad of its result by its own x (relu_grad_of_pool).
void fuse_elementwise(Graph& g);

// Whether m is relu_grad(r, x) of the result r of maxpool_grad(dy, x, y), of r's
// dtype: the training recipe of relu then maxpool. Its kernel has x's tap in a
// register where it selects dy (lower_maxpool_grad), so the relu's mask costs one
// compare there instead of a pass over HBM.
bool relu_grad_of_pool(const Node& pool_grad, const Node& m);

// Whether the lowering computes this conv2d (weights of shape `w`) as W x X per image,
// its result tiles NCHW like its tensors: a pointwise conv (1x1, unpadded, one group;
// strided with at least 128 outputs an image) that is not one channel in and out (a
// depthwise conv there).
bool conv_tiles_nchw(const Node& conv, const Shape& w);

// Whether the lowering may store this conv2d's result as NCHW bands and apply a fused
// member with an operand of its shape there: an ungrouped conv of taps of at least 128
// bytes of channels (input dtype `in`) that is not pointwise, a shifted conv
// (docs/codegen.md); the lowering re-checks against the target (full-width MXUs).
bool conv_bands_nchw(const Node& conv, const Shape& w, DType in);

// Removes identity nodes (exporters emit them for shared initializers) whose
// result is not a graph output; their users read the operand instead.
void fold_identity(Graph& g);

// Removes nodes and constants that no graph output depends on.
void eliminate_dead_code(Graph& g);

}  // namespace tpusim::compiler
