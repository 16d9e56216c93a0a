#include "compiler/passes/passes.h"

#include <cmath>
#include <map>
#include <set>

#include "isa/numerics/bf16.h"
#include "isa/numerics/fp32.h"
#include "isa/numerics/vpu.h"

namespace tpusim::compiler {

void run_passes(Graph& g, const std::vector<Pass>& passes) {
  for (const Pass& p : passes) {
    p.run(g);
    verify(g, "after pass " + p.name);
  }
}

std::vector<Pass> import_pipeline() {
  return {pass_by_name("fold-identity"), pass_by_name("fuse-layernorm"), pass_by_name("fuse-gelu"), pass_by_name("fold-batchnorm"), pass_by_name("dce")};
}

Pass pass_by_name(const std::string& name) {
  if (name == "fuse-layernorm") return {name, fuse_layernorm};
  if (name == "fuse-gelu") return {name, fuse_gelu};
  if (name == "fold-batchnorm") return {name, fold_batchnorm};
  if (name == "fuse-elementwise") return {name, fuse_elementwise};
  if (name == "dce") return {name, eliminate_dead_code};
  if (name == "fold-identity") return {name, fold_identity};
  if (name == "precision-default") return {name, [](Graph& g) { apply_precision(g, num::PrecisionPolicy::kDefault); }};
  if (name == "precision-bf16") return {name, [](Graph& g) { apply_precision(g, num::PrecisionPolicy::kBf16); }};
  throw CompileError("unknown pass '" + name + "'");
}

void apply_precision(Graph& g, num::PrecisionPolicy policy) {
  if (policy != num::PrecisionPolicy::kBf16) return;
  auto retype = [](TensorType& t) {
    if (t.dtype == DType::kF32) t.dtype = DType::kBf16;
  };
  for (GraphInput& i : g.inputs) retype(i.type);
  for (Constant& c : g.constants) {
    if (c.type.dtype != DType::kF32) continue;
    retype(c.type);
    for (float& v : c.f) v = num::round_to_bf16(v);
  }
  for (Node& n : g.nodes) {
    retype(n.type);
    if (n.op == OpKind::kCast) n.attrs["to"] = Attr::String("bf16");
  }
}

namespace {

// Uses of every tensor by nodes, plus one per graph output.
std::map<std::string, int> use_counts(const Graph& g) {
  std::map<std::string, int> u;
  for (const Node& n : g.nodes)
    for (const std::string& s : n.inputs) ++u[s];
  for (const std::string& o : g.outputs) ++u[o];
  return u;
}

std::string fresh_name(const Graph& g, const std::string& base) {
  const auto types = g.types();
  std::string s = base;
  for (int k = 1; types.count(s); ++k) s = base + "." + std::to_string(k);
  return s;
}

// A scalar (any shape with one element) float constant's value.
bool scalar_constant(const Graph& g, const std::string& name, float* v) {
  const Constant* c = g.find_constant(name);
  if (!c || c->type.dtype == DType::kI64 || c->f.size() != 1) return false;
  *v = c->f[0];
  return true;
}

const Node* single_use_producer(const Graph& g, const std::map<std::string, int>& uses, const std::string& t, OpKind op) {
  const Node* p = g.producer(t);
  if (!p || p->op != op) return nullptr;
  auto it = uses.find(t);
  if (it == uses.end() || it->second != 1) return nullptr;
  return p;
}

void replace_node(Graph& g, const std::set<int>& remove, Node fused, int insert_at_id) {
  std::vector<Node> out;
  for (Node& n : g.nodes) {
    if (n.id == insert_at_id) out.push_back(fused);
    if (!remove.count(n.id)) out.push_back(std::move(n));
  }
  g.nodes = std::move(out);
}

}  // namespace

void fold_batchnorm(Graph& g) {
  for (size_t idx = 0; idx < g.nodes.size(); ++idx) {
    const Node bn = g.nodes[idx];
    if (bn.op != OpKind::kBatchNorm) continue;
    const auto uses = use_counts(g);
    const Node* conv = single_use_producer(g, uses, bn.inputs[0], OpKind::kConv2d);
    if (!conv) continue;
    const Constant* w = g.find_constant(conv->inputs[1]);
    const Constant* b = conv->inputs.size() == 3 ? g.find_constant(conv->inputs[2]) : nullptr;
    const Constant *scale = g.find_constant(bn.inputs[1]), *beta = g.find_constant(bn.inputs[2]),
                   *mean = g.find_constant(bn.inputs[3]), *var = g.find_constant(bn.inputs[4]);
    if (!w || (conv->inputs.size() == 3 && !b) || !scale || !beta || !mean || !var) continue;
    const float eps = bn.attr_float("epsilon");
    const int64_t cout = w->type.shape[0], per_out = num_elements(w->type.shape) / cout;
    Constant nw{fresh_name(g, w->name + ".bnfold"), w->type, w->f, {}};
    Constant nb{fresh_name(g, bn.output + ".bias"), {w->type.dtype, {cout}}, std::vector<float>(cout), {}};
    for (int64_t o = 0; o < cout; ++o) {
      const float s = num::div(scale->f[o], num::sqrt(num::add(var->f[o], eps)));
      for (int64_t k = 0; k < per_out; ++k) nw.f[o * per_out + k] = num::mul(w->f[o * per_out + k], s);
      const float bo = b ? b->f[o] : 0.0f;
      nb.f[o] = num::add(num::mul(num::sub(bo, mean->f[o]), s), beta->f[o]);
    }
    for (Node& n : g.nodes)
      if (n.id == conv->id) {
        n.inputs = {n.inputs[0], nw.name, nb.name};
        n.output = bn.output;
      }
    g.constants.push_back(std::move(nw));
    g.constants.push_back(std::move(nb));
    g.nodes.erase(g.nodes.begin() + static_cast<long>(idx));
    --idx;
  }
  eliminate_dead_code(g);
}

void fuse_gelu(Graph& g) {
  const float kSqrt2 = 1.41421356237309504880f;
  for (size_t idx = 0; idx < g.nodes.size(); ++idx) {
    const auto uses = use_counts(g);
    const Node& outer = g.nodes[idx];  // mul(v, 0.5)
    if (outer.op != OpKind::kMul) continue;
    float c;
    int half = -1;
    for (int i = 0; i < 2; ++i)
      if (scalar_constant(g, outer.inputs[i], &c) && c == 0.5f) half = i;
    if (half < 0) continue;
    const Node* v = single_use_producer(g, uses, outer.inputs[1 - half], OpKind::kMul);
    if (!v) continue;
    for (int xi = 0; xi < 2; ++xi) {
      const std::string& x = v->inputs[xi];
      const Node* u = single_use_producer(g, uses, v->inputs[1 - xi], OpKind::kAdd);
      if (!u) continue;
      int one = -1;
      for (int i = 0; i < 2; ++i)
        if (scalar_constant(g, u->inputs[i], &c) && c == 1.0f) one = i;
      if (one < 0) continue;
      const Node* e = single_use_producer(g, uses, u->inputs[1 - one], OpKind::kErf);
      if (!e) continue;
      const Node* t = single_use_producer(g, uses, e->inputs[0], OpKind::kDiv);
      if (!t || t->inputs[0] != x || !scalar_constant(g, t->inputs[1], &c) || c != kSqrt2) continue;
      Node fused;
      fused.id = g.next_id();
      fused.op = OpKind::kGelu;
      fused.inputs = {x};
      fused.output = outer.output;
      fused.type = outer.type;
      const std::set<int> remove = {outer.id, v->id, u->id, e->id, t->id};
      replace_node(g, remove, fused, outer.id);
      idx = 0;
      break;
    }
  }
  eliminate_dead_code(g);
}

void fuse_layernorm(Graph& g) {
  for (size_t idx = 0; idx < g.nodes.size(); ++idx) {
    const auto uses = use_counts(g);
    const Node& out = g.nodes[idx];  // add(mul(div(d, sqrt(..)), gamma), beta)
    if (out.op != OpKind::kAdd) continue;
    for (int bi = 0; bi < 2; ++bi) {
      const Constant* beta = g.find_constant(out.inputs[bi]);
      const Node* scaled = single_use_producer(g, uses, out.inputs[1 - bi], OpKind::kMul);
      if (!beta || !scaled) continue;
      for (int gi = 0; gi < 2; ++gi) {
        const Constant* gamma = g.find_constant(scaled->inputs[gi]);
        const Node* norm = single_use_producer(g, uses, scaled->inputs[1 - gi], OpKind::kDiv);
        if (!gamma || !norm) continue;
        const Node* sq = single_use_producer(g, uses, norm->inputs[1], OpKind::kSqrt);
        const Node* d = g.producer(norm->inputs[0]);
        if (!sq || !d || d->op != OpKind::kSub || uses.at(d->output) != 2) continue;
        const Node* ve = single_use_producer(g, uses, sq->inputs[0], OpKind::kAdd);
        if (!ve) continue;
        float eps = 0;
        int ei = -1;
        for (int i = 0; i < 2; ++i)
          if (scalar_constant(g, ve->inputs[i], &eps)) ei = i;
        if (ei < 0) continue;
        const Node* var = single_use_producer(g, uses, ve->inputs[1 - ei], OpKind::kReduceMean);
        if (!var) continue;
        const Node* p = g.producer(var->inputs[0]);
        if (!p || uses.at(p->output) != 1) continue;
        const bool square = (p->op == OpKind::kPow && p->attr_float("exponent") == 2.0f && p->inputs[0] == d->output) ||
                            (p->op == OpKind::kMul && p->inputs[0] == d->output && p->inputs[1] == d->output);
        if (!square) continue;
        const std::string& x = d->inputs[0];
        const Node* mean = single_use_producer(g, uses, d->inputs[1], OpKind::kReduceMean);
        if (!mean || mean->inputs[0] != x) continue;
        const TensorType xt = g.types().at(x);
        const int64_t last = static_cast<int64_t>(xt.shape.size()) - 1;
        const std::vector<int64_t> want_axes = {last};
        if (mean->attr_ints("axes") != want_axes || var->attr_ints("axes") != want_axes || mean->attr_int("keepdims") != 1 ||
            var->attr_int("keepdims") != 1)
          continue;
        const Shape cshape = {xt.shape.back()};
        if (gamma->type.shape != cshape || beta->type.shape != cshape || out.type != xt) continue;
        Node fused;
        fused.id = g.next_id();
        fused.op = OpKind::kLayerNorm;
        fused.inputs = {x, gamma->name, beta->name};
        fused.output = out.output;
        fused.type = out.type;
        fused.attrs["axis"] = Attr::Int(last);
        fused.attrs["epsilon"] = Attr::Float(eps);
        const std::set<int> remove = {out.id, scaled->id, norm->id, sq->id, d->id, ve->id, var->id, p->id, mean->id};
        replace_node(g, remove, fused, out.id);
        idx = static_cast<size_t>(-1);
        goto next;
      }
    }
  next:;
  }
  eliminate_dead_code(g);
}

bool conv_tiles_nchw(const Node& conv, const Shape& ws) {
  auto all = [&](const char* name, int64_t v) {
    if (!conv.has_attr(name)) return true;
    for (int64_t x : conv.attr_ints(name))
      if (x != v) return false;
    return true;
  };
  // A strided one only with a column tile of outputs an image: below that its weights,
  // the LHS, stream once an image for a few columns (resnet50's layer4 downsample, 7 x 7
  // outputs, 44 K -> 72 K cycles at batch 8 on v3), where the im2col matmul runs the
  // batch as one tall matmul.
  const bool wide = conv.type.shape.size() == 4 && conv.type.shape[2] * conv.type.shape[3] >= 128;
  return ws.size() == 4 && ws[2] == 1 && ws[3] == 1 && !(ws[0] == 1 && ws[1] == 1) &&
         (!conv.has_attr("groups") || conv.attr_int("groups") == 1) && all("pads", 0) && (all("strides", 1) || wide);
}

bool conv_bands_nchw(const Node& conv, const Shape& ws, DType in) {
  const int64_t e = in == DType::kBf16 ? 2 : 4;
  return ws.size() == 4 && !conv_tiles_nchw(conv, ws) && (!conv.has_attr("groups") || conv.attr_int("groups") == 1) &&
         !(ws[2] == 1 && ws[3] == 1) && ws[1] * e >= 128;
}

bool relu_grad_of_pool(const Node& pool_grad, const Node& m) {
  return pool_grad.op == OpKind::kMaxPoolGrad && m.op == OpKind::kReluGrad && m.inputs[0] == pool_grad.output &&
         m.inputs[1] == pool_grad.inputs[1] && m.type == pool_grad.type;
}

void fuse_elementwise(Graph& g) {
  const auto uses = use_counts(g);
  std::map<std::string, size_t> at;  // tensor -> index of the node defining it
  for (size_t k = 0; k < g.nodes.size(); ++k) at[g.nodes[k].output] = k;
  std::map<int, size_t> index_of;
  for (size_t k = 0; k < g.nodes.size(); ++k) index_of[g.nodes[k].id] = k;
  std::map<int, std::string> chain_end;  // root id -> the tensor its kernel holds in registers
  std::set<int> on_bands;                // convs whose chain has taken an operand on NCHW bands
  const auto types = g.types();
  auto feeder = [&](const Node& f, size_t ri, const Node& root) {
    if (!is_elementwise(f.op) || f.fusion_group >= 0 || chain_end.count(f.id) || f.type.dtype == DType::kI64 ||
        f.type.shape != root.type.shape || uses.at(f.output) != 1)
      return false;
    for (const std::string& in : f.inputs) {
      auto it = at.find(in);
      if ((it != at.end() && it->second >= ri) || types.at(in).dtype == DType::kI64) return false;
    }
    return true;
  };
  for (size_t k = 0; k < g.nodes.size(); ++k) {
    Node& n = g.nodes[k];
    if (!is_elementwise(n.op) || n.fusion_group >= 0 || n.type.dtype == DType::kI64) continue;
    for (const std::string& in : n.inputs) {
      auto it = at.find(in);
      if (it == at.end()) continue;
      const Node& p = g.nodes[it->second];
      const int root_id = p.fusion_group >= 0 ? p.fusion_group : p.id;
      const Node& root = g.nodes[index_of.at(root_id)];
      // The kernels that can apply an op to their output tiles: matmul and conv2d
      // epilogues, and elementwise chains; the op continues the chain's end. An
      // elementwise chain also goes on past a result that other nodes read (its
      // kernel stores that result as well); an epilogue stops there.
      if (root.op == OpKind::kMaxPoolGrad) {
        if (root_id == p.id && !chain_end.count(root_id) && uses.at(in) == 1 && relu_grad_of_pool(root, n)) {
          n.fusion_group = root_id;
          chain_end[root_id] = n.output;
          break;
        }
        continue;
      }
      if (root.op != OpKind::kMatmul && root.op != OpKind::kConv2d && !is_elementwise(root.op)) continue;
      if (uses.at(in) != 1 && !is_elementwise(root.op)) continue;
      if (chain_end.count(root_id) ? chain_end[root_id] != in : root_id != p.id) continue;
      // Same tiles as the root's result.
      if (n.type.shape != root.type.shape) continue;
      if (on_bands.count(root_id) && (n.inputs.size() == 2 || n.type.dtype != root.type.dtype)) continue;
      bool bands = false;
      if (n.inputs.size() == 2) {
        if (n.inputs[0] == n.inputs[1]) continue;
        const std::string& other = n.inputs[0] == in ? n.inputs[1] : n.inputs[0];
        // The other operand must exist when the root's kernel runs; a conv's tiles
        // are NHWC while tensors are NCHW, so it takes only a single element there,
        // but for a pointwise conv's NCHW tiles (a bottleneck's residual add) an
        // operand of its own shape too, and a shifted conv's NCHW bands one of its
        // shape and dtype (a basic block's residual add), unary members only after it
        // (the lowering checks the target: full-width MXUs).
        auto ot = at.find(other);
        // An elementwise op read by this member alone, of the root's shape and of
        // operands that exist before the root runs, joins as a feeder: an elementwise
        // chain's kernel computes it in registers where the member needs it, wherever
        // it stands in the order (the data-parallel step's gradient mean, div(sum,
        // replicas), into its velocity's add: not stored and read back).
        if (ot != at.end() && is_elementwise(root.op) && feeder(g.nodes[ot->second], index_of.at(root_id), root)) {
          g.nodes[ot->second].fusion_group = root_id;
          n.fusion_group = root_id;
          chain_end[root_id] = n.output;
          break;
        }
        if (ot != at.end() && ot->second >= index_of.at(root_id)) continue;
        const int64_t on = num_elements(types.at(other).shape);
        if (root.op == OpKind::kConv2d && on != 1) {
          const Shape& ws = types.at(root.inputs[1]).shape;
          const bool same = types.at(other).shape == root.type.shape;
          bands = same && types.at(other).dtype == root.type.dtype && n.type.dtype == root.type.dtype &&
                  conv_bands_nchw(root, ws, types.at(root.inputs[0]).dtype);
          if (!(conv_tiles_nchw(root, ws) && same) && !bands) continue;
        }
      }
      if (bands) on_bands.insert(root_id);
      n.fusion_group = root_id;
      chain_end[root_id] = n.output;
      break;
    }
  }
}

void fold_identity(Graph& g) {
  const std::set<std::string> outputs(g.outputs.begin(), g.outputs.end());
  std::map<std::string, std::string> alias;
  std::vector<Node> kept;
  for (Node& n : g.nodes) {
    for (std::string& s : n.inputs)
      if (alias.count(s)) s = alias[s];
    if (n.op == OpKind::kIdentity && !outputs.count(n.output)) {
      alias[n.output] = n.inputs[0];
      continue;
    }
    kept.push_back(std::move(n));
  }
  g.nodes = std::move(kept);
}

void eliminate_dead_code(Graph& g) {
  std::set<std::string> live(g.outputs.begin(), g.outputs.end());
  std::vector<bool> keep(g.nodes.size(), false);
  for (size_t k = g.nodes.size(); k-- > 0;) {
    if (!live.count(g.nodes[k].output)) continue;
    keep[k] = true;
    for (const std::string& s : g.nodes[k].inputs) live.insert(s);
  }
  std::vector<Node> nodes;
  std::set<int> kept_ids;
  for (size_t k = 0; k < g.nodes.size(); ++k)
    if (keep[k]) {
      nodes.push_back(std::move(g.nodes[k]));
      kept_ids.insert(nodes.back().id);
    }
  for (Node& n : nodes)
    if (n.fusion_group >= 0 && !kept_ids.count(n.fusion_group)) n.fusion_group = -1;
  g.nodes = std::move(nodes);
  std::vector<Constant> consts;
  for (Constant& c : g.constants)
    if (live.count(c.name)) consts.push_back(std::move(c));
  g.constants = std::move(consts);
}

}  // namespace tpusim::compiler
