// Reverse-mode differentiation over the graph IR: every gradient is built from
// ordinary IR ops (matmul, conv2d, transpose, reduce_sum, ...) plus the backward
// ops relu_grad, maxpool_grad, reverse and im2col, so the graph reference defines
// its bits and the lowering reproduces them. docs/training.md lists the recipes.
#include "compiler/train/train.h"

#include <cmath>
#include <cstdlib>
#include <functional>
#include <map>
#include <set>

namespace tpusim::compiler {

namespace {

[[noreturn]] void spec_error(const std::string& what) { throw CompileError("--train/--loss: " + what); }

float parse_float(const std::string& key, const std::string& v) {
  char* end = nullptr;
  const float f = std::strtof(v.c_str(), &end);
  if (v.empty() || *end != '\0' || !std::isfinite(f)) spec_error("'" + key + "=" + v + "' is not a finite number");
  return f;
}

class Builder {
 public:
  Builder(const Graph& fwd, const TrainOptions& o) : g_(fwd), opt_(o), next_id_(fwd.next_id()) {
    for (const auto& [name, t] : fwd.types()) types_[name] = t;
  }

  Graph build() {
    if (g_.outputs.size() != 1)
      throw CompileError(g_.name + ": a training graph needs a forward graph with one output, it has " +
                         std::to_string(g_.outputs.size()));
    if (opt_.replicas < 1) throw CompileError("replicas must be >= 1");
    Graph& g = g_;
    std::string pred = g.outputs[0];
    // A final softmax is folded into the cross-entropy: its logits are the prediction.
    if (opt_.loss == TrainOptions::Loss::kSoftmaxXent) {
      const Node* p = g.producer(pred);
      if (p && p->op == OpKind::kSoftmax && p->attr_int("axis") == static_cast<int64_t>(p->type.shape.size()) - 1) {
        pred = p->inputs[0];
        const std::string dead = p->output;
        g.nodes.erase(g.nodes.begin() + (p - g.nodes.data()));
        types_.erase(dead);
      }
    }
    forward_count_ = g.nodes.size();
    const TensorType pt = types_.at(pred);
    if (pt.shape.size() != 2) throw CompileError(g.name + ": the prediction %" + pred + " must be [batch, n], is " + type_str(pt));
    const int64_t B = pt.shape[0], C = pt.shape[1];
    if (B % opt_.replicas != 0)
      throw CompileError(g.name + ": batch " + std::to_string(B) + " does not split over " + std::to_string(opt_.replicas) + " replicas");
    const float local_b = static_cast<float>(B / opt_.replicas);
    const DType dt = pt.dtype;

    // Parameters: float constants with a rank (scalars are op constants).
    std::set<std::string> params;
    for (const Constant& c : g.constants)
      if (c.type.dtype != DType::kI64 && !c.type.shape.empty()) params.insert(c.name);
    // Tensors whose gradient is needed: parameters and whatever depends on one.
    for (const std::string& p : params) needs_.insert(p);
    for (const Node& n : g.nodes)
      for (const std::string& i : n.inputs)
        if (needs_.count(i)) needs_.insert(n.output);
    if (!needs_.count(pred)) throw CompileError(g.name + ": the output does not depend on any parameter: nothing to train");

    // ---- loss and its gradient with respect to the prediction
    std::string loss_sum, dpred;
    if (opt_.loss == TrainOptions::Loss::kSoftmaxXent) {
      std::string t;
      if (opt_.labels == TrainOptions::Labels::kOneHot) {
        g.inputs.push_back({"labels", {dt, {B, C}}});
        types_["labels"] = {dt, {B, C}};
        t = "labels";
      } else {
        // One-hot from class indices: 1 - clip((label - j)^2, 0, 1), exact for
        // integer-valued labels below 2^12.
        g.inputs.push_back({"labels", {dt, {B}}});
        types_["labels"] = {dt, {B}};
        std::vector<float> iota(static_cast<size_t>(C));
        for (int64_t j = 0; j < C; ++j) iota[static_cast<size_t>(j)] = static_cast<float>(j);
        const std::string col = node(OpKind::kReshape, {"labels"}, {{"shape", Attr::Ints({B, 1})}}, "labels.column");
        const std::string d = node(OpKind::kSub, {col, constant("classes", {1, C}, iota)}, {}, "labels.diff");
        const std::string q = node(OpKind::kMul, {d, d}, {}, "labels.sq");
        const std::string c = node(OpKind::kClip, {q}, {{"min", Attr::Float(0.0f)}, {"max", Attr::Float(1.0f)}}, "labels.far");
        t = node(OpKind::kSub, {scalar("one", 1.0f), c}, {}, "labels.onehot");
      }
      const Attrs last{{"axes", Attr::Ints({1})}, {"keepdims", Attr::Int(1)}};
      const std::string m = node(OpKind::kReduceMax, {pred}, last, "xent.max");
      const std::string zs = node(OpKind::kSub, {pred, m}, {}, "xent.shifted");
      const std::string e = node(OpKind::kExp, {zs}, {}, "xent.exp");
      const std::string s = node(OpKind::kReduceSum, {e}, last, "xent.sum");
      const std::string ls = node(OpKind::kLog, {s}, {}, "xent.logsum");
      const std::string lp = node(OpKind::kSub, {zs, ls}, {}, "xent.logp");
      const std::string tl = node(OpKind::kMul, {t, lp}, {}, "xent.tlogp");
      loss_sum = node(OpKind::kReduceSum, {tl}, {{"axes", Attr::Ints({0, 1})}, {"keepdims", Attr::Int(1)}}, "xent.total");
      loss_sum = node(OpKind::kNeg, {loss_sum}, {}, "xent.negtotal");
      const std::string p = node(OpKind::kDiv, {e, s}, {}, "xent.softmax");
      const std::string d = node(OpKind::kSub, {p, t}, {}, "xent.residual");
      dpred = node(OpKind::kDiv, {d, scalar("local_batch", local_b)}, {}, "grad." + pred);
    } else {
      g.inputs.push_back({"labels", pt});
      types_["labels"] = pt;
      const std::string d = node(OpKind::kSub, {pred, "labels"}, {}, "mse.diff");
      const std::string q = node(OpKind::kMul, {d, d}, {}, "mse.sq");
      loss_sum = node(OpKind::kReduceSum, {q}, {{"axes", Attr::Ints({0, 1})}, {"keepdims", Attr::Int(1)}}, "mse.total");
      const float count = local_b * static_cast<float>(C);
      const std::string d2 = node(OpKind::kAdd, {d, d}, {}, "mse.twice");
      dpred = node(OpKind::kDiv, {d2, scalar("local_count", count)}, {}, "grad." + pred);
      loss_count_ = count;
    }
    const float denom = opt_.loss == TrainOptions::Loss::kMse ? loss_count_ : local_b;
    std::string loss = node(OpKind::kDiv, {loss_sum, scalar("loss_denominator", denom)}, {}, "loss.local");
    // ---- backward, nodes in reverse order; gradients of a tensor used several
    // times are added in the order its users are visited.
    grad_[pred] = dpred;
    const size_t forward_nodes = forward_count_;
    for (size_t k = forward_nodes; k-- > 0;) {
      const Node n = g.nodes[k];
      auto it = grad_.find(n.output);
      if (it == grad_.end()) continue;
      backward(n, it->second);
    }

    // ---- data parallel: one all_reduce of a bucket holding the local loss and
    // every parameter gradient, flattened and concatenated in constant order (one
    // collective's latency instead of one per parameter, as XLA's all-reduce
    // combiner and DDP's buckets do); the sums are sliced back out.
    std::map<std::string, std::string> summed;
    if (opt_.replicas > 1) {
      std::vector<std::pair<std::string, std::string>> items{{"loss", loss}};
      for (const Constant& c : g.constants)
        if (params.count(c.name) && grad_.count(c.name)) items.push_back({c.name, grad_.at(c.name)});
      std::vector<std::string> flat;
      std::vector<int64_t> sizes;
      for (const auto& [name, t] : items) {
        const int64_t n = num_elements(types_.at(t).shape);
        sizes.push_back(n);
        flat.push_back(node(OpKind::kReshape, {t}, {{"shape", Attr::Ints({1, n})}}, name + ".grad.flat"));
      }
      const std::string bucket = node(OpKind::kConcat, flat, {{"axis", Attr::Int(1)}}, "grads.bucket");
      const std::string sum = node(OpKind::kAllReduce, {bucket}, {}, "grads.bucket.sum");
      int64_t off = 0;
      for (size_t k = 0; k < items.size(); ++k) {
        const std::string& t = items[k].second;
        const std::string sl = node(OpKind::kSlice, {sum},
                                    {{"starts", Attr::Ints({0, off})}, {"ends", Attr::Ints({1, off + sizes[k]})},
                                     {"axes", Attr::Ints({0, 1})}, {"steps", Attr::Ints({1, 1})}},
                                    items[k].first + ".grad.sum.flat");
        summed[items[k].first] =
            node(OpKind::kReshape, {sl}, {{"shape", Attr::Ints(types_.at(t).shape)}}, items[k].first + ".grad.sum");
        off += sizes[k];
      }
      loss = node(OpKind::kDiv, {summed.at("loss"), scalar("replicas", static_cast<float>(opt_.replicas))}, {}, "loss.mean");
    }
    loss = node(OpKind::kIdentity, {loss}, {}, "loss");

    // ---- updates, in the order of the constants. A parameter of rank > 2 is
    // updated through its 2-D view [dim 0, the rest] and the hyperparameters are
    // rows of that length: a broadcast then copies whole rows (a scalar would be
    // replicated element by element). The bits are the same as with a scalar.
    std::vector<std::string> outs{loss};
    // Every parameter's 2-D views (the weight's and its gradient's) first, then the
    // updates: an update is one elementwise chain (velocity, stored on the way, then
    // the step and the sub), a member's other operand must exist before its root runs,
    // and the small parameters' updates run as one kernel (docs/codegen.md, row
    // regions), which needs every update's operands made before the first update.
    struct Param {
      std::string name;
      Shape S, view;     // its shape, and the 2-D view it is updated through
      int64_t row;       // the hyperparameters' row length
      std::string w, g;  // the views of the parameter and of its gradient
    };
    std::vector<Param> updated;  // copies: the updates add constants (velocities)
    for (const Constant& c0 : g.constants) {
      if (!params.count(c0.name) || !grad_.count(c0.name)) continue;
      const Shape& S = c0.type.shape;
      const int64_t row = S.size() >= 2 ? num_elements(Shape(S.begin() + 1, S.end())) : S[0];
      const Shape view = S.size() >= 2 ? Shape{S[0], row} : S;
      auto as_view = [&](const std::string& t, const std::string& name) {
        return S.size() > 2 ? node(OpKind::kReshape, {t}, {{"shape", Attr::Ints(view)}}, name) : t;
      };
      const std::string w = as_view(c0.name, c0.name + ".2d");
      updated.push_back({c0.name, S, view, row, w,
                         as_view(opt_.replicas > 1 ? summed.at(c0.name) : grad_.at(c0.name), c0.name + ".grad.2d")});
    }
    for (const Param& p : updated) {
      const std::string& name = p.name;
      const Shape& S = p.S;
      const int64_t row = p.row;
      auto as_param = [&](const std::string& t, const std::string& nm) {
        return S.size() > 2 ? node(OpKind::kReshape, {t}, {{"shape", Attr::Ints(S)}}, nm) : t;
      };
      const std::string& w = p.w;
      std::string gw = p.g;
      if (opt_.replicas > 1)
        gw = node(OpKind::kDiv, {gw, row_of("replicas", static_cast<float>(opt_.replicas), row)}, {}, name + ".grad.mean");
      std::string step = gw, vnew;
      if (opt_.momentum != 0.0f) {
        const std::string v = constant(name + ".velocity", p.view,
                                       std::vector<float>(static_cast<size_t>(num_elements(S)), 0.0f));
        const std::string mv = node(OpKind::kMul, {v, row_of("momentum", opt_.momentum, row)}, {}, name + ".velocity.decayed");
        step = node(OpKind::kAdd, {mv, gw}, {}, S.size() > 2 ? name + ".velocity.2d" : name + ".velocity.new");
        vnew = as_param(step, name + ".velocity.new");
      }
      const std::string sc = node(OpKind::kMul, {step, row_of("lr", opt_.lr, row)}, {}, name + ".step");
      outs.push_back(as_param(node(OpKind::kSub, {w, sc}, {}, S.size() > 2 ? name + ".new.2d" : name + ".new"),
                              name + ".new"));
      if (!vnew.empty()) outs.push_back(vnew);
    }
    if (outs.size() == 1) throw CompileError(g.name + ": no parameter receives a gradient");
    g.outputs = outs;
    g.name = g.name + "_train";
    verify(g, "training graph");
    return g;
  }

 private:
  Graph g_;
  TrainOptions opt_;
  int next_id_;
  size_t forward_count_ = 0;
  float loss_count_ = 1.0f;
  std::map<std::string, TensorType> types_;
  std::set<std::string> needs_;
  std::map<std::string, std::string> grad_;
  std::set<std::string> names_;

  std::string fresh(const std::string& want) {
    std::string s = want;
    for (int k = 1; types_.count(s) || names_.count(s); ++k) s = want + "." + std::to_string(k);
    names_.insert(s);
    return s;
  }

  std::string node(OpKind op, std::vector<std::string> inputs, Attrs attrs, const std::string& name) {
    Node n;
    n.id = next_id_++;
    n.op = op;
    n.inputs = std::move(inputs);
    n.attrs = std::move(attrs);
    n.output = fresh(name);
    std::vector<TensorType> in;
    for (const std::string& i : n.inputs) in.push_back(types_.at(i));
    n.type = infer_type(n, in);
    types_[n.output] = n.type;
    g_.nodes.push_back(n);
    return n.output;
  }

  std::string constant(const std::string& name, const Shape& shape, std::vector<float> v) {
    Constant c;
    c.name = fresh(name);
    c.type = {DType::kF32, shape};
    c.f = std::move(v);
    types_[c.name] = c.type;
    g_.constants.push_back(c);
    return c.name;
  }

  // One-element constants, shared by name and value.
  std::string scalar(const std::string& name, float v) {
    const std::string key = name + "=" + std::to_string(v);
    auto it = scalars_.find(key);
    if (it != scalars_.end()) return it->second;
    return scalars_[key] = constant(name, {1}, {v});
  }
  std::map<std::string, std::string> scalars_;

  // A hyperparameter as a row of `len` equal values, shared by name, value, length.
  std::string row_of(const std::string& name, float v, int64_t len) {
    const std::string key = name + "=" + std::to_string(v) + "x" + std::to_string(len);
    auto it = scalars_.find(key);
    if (it != scalars_.end()) return it->second;
    return scalars_[key] = constant(name + ".row", {len}, std::vector<float>(static_cast<size_t>(len), v));
  }

  void accumulate(const std::string& tensor, const std::string& gr) {
    if (!needs_.count(tensor)) return;
    auto it = grad_.find(tensor);
    if (it == grad_.end()) grad_[tensor] = gr;
    else it->second = node(OpKind::kAdd, {it->second, gr}, {}, "grad." + tensor);
  }

  [[noreturn]] void no_recipe(const Node& n, const std::string& why) const {
    throw CompileError(g_.name + ": node '" + n.output + "' (#" + std::to_string(n.id) + ", " + op_name(n.op) +
                       "): no gradient recipe for " + why);
  }

  // Sum of a [R, C] gradient over its rows: reduce_sum over axis 0, which the lowering
  // runs down the columns with the whole axis in VMEM (lower_columns: 1.5 KiB of VMEM
  // a row, so up to kColumnRows rows here, 1.5 MiB). Longer, transpose to [C, R] and
  // reduce_sum over the last axis: two ops, each a DMA latency or more (the MLP's b1
  // at batch 8, v3: 2,555 cycles against 940). The two sum in other orders
  // (docs/numerics.md: column vs row reduction).
  static constexpr int64_t kColumnRows = 1024;
  std::string sum_rows(const std::string& g2, const std::string& name) {
    if (types_.at(g2).shape[0] <= kColumnRows)
      return node(OpKind::kReduceSum, {g2}, {{"axes", Attr::Ints({0})}, {"keepdims", Attr::Int(0)}}, name);
    const std::string t = node(OpKind::kTranspose, {g2}, {{"perm", Attr::Ints({1, 0})}}, name + ".t");
    return node(OpKind::kReduceSum, {t}, {{"axes", Attr::Ints({1})}, {"keepdims", Attr::Int(0)}}, name);
  }

  // The gradient of an operand that was broadcast to `gr`'s shape.
  std::string unbroadcast(const Node& n, const std::string& gr, const std::string& operand) {
    const Shape& gs = types_.at(gr).shape;
    const Shape& os = types_.at(operand).shape;
    if (gs == os) return gr;
    // A vector along the last axis, broadcast over the leading ones (a bias).
    if (os.size() == 1 && gs.size() >= 1 && os[0] == gs.back()) {
      if (gs.size() != 2) no_recipe(n, "a bias broadcast over a rank-" + std::to_string(gs.size()) + " result");
      return sum_rows(gr, "grad." + operand);
    }
    no_recipe(n, "operand %" + operand + " broadcast from " + shape_str(os) + " to " + shape_str(gs));
  }

  void backward(const Node& n, const std::string& G) {
    auto needs = [&](size_t k) { return k < n.inputs.size() && needs_.count(n.inputs[k]) != 0; };
    const std::string pre = "grad.";
    switch (n.op) {
      case OpKind::kMatmul: {
        const std::string &A = n.inputs[0], &Bm = n.inputs[1];
        if (types_.at(A).shape.size() != 2 || types_.at(Bm).shape.size() != 2) no_recipe(n, "a batched matmul");
        if (n.attr_int("trans_a")) no_recipe(n, "trans_a = 1");
        if ((n.has_attr("alpha") && n.attr_float("alpha") != 1.0f) || (n.has_attr("beta") && n.attr_float("beta") != 1.0f))
          no_recipe(n, "alpha or beta != 1");
        const bool tb = n.attr_int("trans_b") != 0;
        if (needs(0)) {  // dA = G B^T  (B given as [N, K] when trans_b: G B)
          Attrs a;
          if (!tb) a["trans_b"] = Attr::Int(1);
          accumulate(A, node(OpKind::kMatmul, {G, Bm}, a, pre + A));
        }
        if (needs(1)) {  // dB = A^T G  (trans_b: G^T A)
          accumulate(Bm, tb ? node(OpKind::kMatmul, {G, A}, {{"trans_a", Attr::Int(1)}}, pre + Bm)
                            : node(OpKind::kMatmul, {A, G}, {{"trans_a", Attr::Int(1)}}, pre + Bm));
        }
        if (needs(2)) accumulate(n.inputs[2], unbroadcast(n, G, n.inputs[2]));
        return;
      }
      case OpKind::kConv2d: {
        const std::string &X = n.inputs[0], &Wt = n.inputs[1];
        const auto& st = n.attr_ints("strides");
        const auto& pads = n.attr_ints("pads");
        const auto& dil = n.attr_ints("dilations");
        if ((n.has_attr("groups") && n.attr_int("groups") != 1)) no_recipe(n, "groups != 1");
        if (st[0] != 1 || st[1] != 1 || dil[0] != 1 || dil[1] != 1) no_recipe(n, "strides or dilations != 1");
        const Shape& ws = types_.at(Wt).shape;
        const int64_t KH = ws[2], KW = ws[3];
        if (needs(1) || needs(2)) {
          // Output-gradient rows (n, oh, ow) x Co: im2col with a 1x1 window is the
          // NHWC matrix, shaped from the operand so replicas re-infer it.
          const std::string gm = node(OpKind::kIm2col, {G},
                                      {{"kernel", Attr::Ints({1, 1})}, {"strides", Attr::Ints({1, 1})},
                                       {"pads", Attr::Ints({0, 0, 0, 0})}, {"dilations", Attr::Ints({1, 1})}},
                                      pre + n.output + ".rows");
          if (needs(1)) {
            // dW[(kh,kw,ci), co] = im2col(X)^T G_rows, back to OIHW.
            const std::string p = node(OpKind::kIm2col, {X},
                                       {{"kernel", Attr::Ints({KH, KW})}, {"strides", Attr::Ints({1, 1})},
                                        {"pads", Attr::Ints(pads)}, {"dilations", Attr::Ints({1, 1})}},
                                       pre + X + ".patches");
            const std::string dwm = node(OpKind::kMatmul, {p, gm}, {{"trans_a", Attr::Int(1)}}, pre + Wt + ".hwio");
            const std::string r4 = node(OpKind::kReshape, {dwm}, {{"shape", Attr::Ints({KH, KW, ws[1], ws[0]})}}, pre + Wt + ".4d");
            accumulate(Wt, node(OpKind::kTranspose, {r4}, {{"perm", Attr::Ints({3, 2, 0, 1})}}, pre + Wt));
          }
          if (needs(2)) accumulate(n.inputs[2], sum_rows(gm, pre + n.inputs[2]));
        }
        if (needs(0)) {
          // dX = conv2d(G, W transposed to IOHW and flipped in space), pads K-1-p.
          for (int i = 0; i < 4; ++i)
            if (pads[static_cast<size_t>(i)] > (i % 2 == 0 ? KH : KW) - 1) no_recipe(n, "pads larger than the kernel - 1");
          const std::string wt = node(OpKind::kTranspose, {Wt}, {{"perm", Attr::Ints({1, 0, 2, 3})}}, Wt + ".iohw");
          const std::string wf = node(OpKind::kReverse, {wt}, {{"axes", Attr::Ints({2, 3})}}, Wt + ".flipped");
          accumulate(X, node(OpKind::kConv2d, {G, wf},
                             {{"strides", Attr::Ints({1, 1})},
                              {"pads", Attr::Ints({KH - 1 - pads[0], KW - 1 - pads[1], KH - 1 - pads[2], KW - 1 - pads[3]})},
                              {"dilations", Attr::Ints({1, 1})},
                              {"groups", Attr::Int(1)}},
                             pre + X));
        }
        return;
      }
      case OpKind::kRelu:
        // On y = relu(x), not x: y > +0.0 exactly where x > +0.0 (DAZ reads a subnormal
        // x as a zero, NaN compares false either way), and x's only use is then the
        // relu, which so fuses into the op that produced x (a conv's epilogue).
        accumulate(n.inputs[0], node(OpKind::kReluGrad, {G, n.output}, {}, pre + n.inputs[0]));
        return;
      case OpKind::kAdd:
        if (needs(0)) accumulate(n.inputs[0], unbroadcast(n, G, n.inputs[0]));
        if (needs(1)) accumulate(n.inputs[1], unbroadcast(n, G, n.inputs[1]));
        return;
      case OpKind::kSub:
        if (needs(0)) accumulate(n.inputs[0], unbroadcast(n, G, n.inputs[0]));
        if (needs(1)) accumulate(n.inputs[1], node(OpKind::kNeg, {unbroadcast(n, G, n.inputs[1])}, {}, pre + n.inputs[1]));
        return;
      case OpKind::kMaxPool:
        accumulate(n.inputs[0], node(OpKind::kMaxPoolGrad, {G, n.inputs[0], n.output},
                                     {{"kernel", n.attrs.at("kernel")}, {"strides", n.attrs.at("strides")},
                                      {"pads", n.attrs.at("pads")}},
                                     pre + n.inputs[0]));
        return;
      case OpKind::kGlobalAvgPool: {
        const Shape& xs = types_.at(n.inputs[0]).shape;
        const int64_t hw = xs[2] * xs[3];
        const std::string d = node(OpKind::kDiv, {G, scalar("pool_size", static_cast<float>(hw))}, {}, pre + n.output + ".mean");
        const std::string z = constant("zeros", {1, 1, xs[2], xs[3]}, std::vector<float>(static_cast<size_t>(hw), 0.0f));
        accumulate(n.inputs[0], node(OpKind::kAdd, {z, d}, {}, pre + n.inputs[0]));
        return;
      }
      case OpKind::kReshape:
      case OpKind::kFlatten:
        accumulate(n.inputs[0], node(OpKind::kReshape, {G}, {{"shape", Attr::Ints(types_.at(n.inputs[0]).shape)}},
                                     pre + n.inputs[0]));
        return;
      case OpKind::kIdentity:
        accumulate(n.inputs[0], G);
        return;
      case OpKind::kNeg:
        accumulate(n.inputs[0], node(OpKind::kNeg, {G}, {}, pre + n.inputs[0]));
        return;
      case OpKind::kMul:  // d(a*b) = G*b, G*a, each summed back over its broadcast
        if (needs(0)) accumulate(n.inputs[0], unbroadcast(n, node(OpKind::kMul, {G, n.inputs[1]}, {}, pre + n.inputs[0] + ".full"), n.inputs[0]));
        if (needs(1)) accumulate(n.inputs[1], unbroadcast(n, node(OpKind::kMul, {G, n.inputs[0]}, {}, pre + n.inputs[1] + ".full"), n.inputs[1]));
        return;
      case OpKind::kDiv:  // d(a/b) = G/b for a; b (a divisor that depends on a parameter) has no recipe
        if (needs(1)) no_recipe(n, "a divisor that depends on a parameter");
        accumulate(n.inputs[0], unbroadcast(n, node(OpKind::kDiv, {G, n.inputs[1]}, {}, pre + n.inputs[0] + ".full"), n.inputs[0]));
        return;
      case OpKind::kTanh: {  // G * (1 - y*y)
        const int64_t last = n.type.shape.empty() ? 1 : n.type.shape.back();
        const std::string y2 = node(OpKind::kMul, {n.output, n.output}, {}, pre + n.output + ".sq");
        const std::string d = node(OpKind::kSub, {row_of("one", 1.0f, last), y2}, {}, pre + n.output + ".slope");
        accumulate(n.inputs[0], node(OpKind::kMul, {G, d}, {}, pre + n.inputs[0]));
        return;
      }
      case OpKind::kSigmoid: {  // G * (y * (1 - y))
        const int64_t last = n.type.shape.empty() ? 1 : n.type.shape.back();
        const std::string c = node(OpKind::kSub, {row_of("one", 1.0f, last), n.output}, {}, pre + n.output + ".complement");
        const std::string d = node(OpKind::kMul, {n.output, c}, {}, pre + n.output + ".slope");
        accumulate(n.inputs[0], node(OpKind::kMul, {G, d}, {}, pre + n.inputs[0]));
        return;
      }
      case OpKind::kSoftmax: {  // y * (G - sum(G * y)) over the softmax axis (the last)
        const int64_t axis = n.attr_int("axis");
        if (axis != static_cast<int64_t>(n.type.shape.size()) - 1) no_recipe(n, "softmax over other than the last axis");
        const std::string gy = node(OpKind::kMul, {G, n.output}, {}, pre + n.output + ".gy");
        const std::string sm = node(OpKind::kReduceSum, {gy}, {{"axes", Attr::Ints({axis})}, {"keepdims", Attr::Int(1)}},
                                    pre + n.output + ".dot");
        const std::string d = node(OpKind::kSub, {G, sm}, {}, pre + n.output + ".centered");
        accumulate(n.inputs[0], node(OpKind::kMul, {n.output, d}, {}, pre + n.inputs[0]));
        return;
      }
      default:
        no_recipe(n, std::string("op '") + op_name(n.op) + "'");
    }
  }
};

}  // namespace

void parse_train_spec(const std::string& optimizer, const std::string& loss, TrainOptions* o) {
  const size_t colon = optimizer.find(':');
  const std::string kind = optimizer.substr(0, colon);
  if (kind != "sgd") spec_error("optimizer '" + kind + "' is not supported (sgd:lr=X[,momentum=Y])");
  bool have_lr = false;
  if (colon != std::string::npos) {
    std::string rest = optimizer.substr(colon + 1);
    size_t p = 0;
    while (p <= rest.size()) {
      const size_t comma = rest.find(',', p);
      const std::string kv = rest.substr(p, comma == std::string::npos ? std::string::npos : comma - p);
      const size_t eq = kv.find('=');
      if (eq == std::string::npos) spec_error("'" + kv + "' is not KEY=VALUE");
      const std::string k = kv.substr(0, eq), v = kv.substr(eq + 1);
      if (k == "lr") {
        o->lr = parse_float(k, v);
        have_lr = true;
      } else if (k == "momentum") {
        o->momentum = parse_float(k, v);
      } else {
        spec_error("unknown sgd parameter '" + k + "' (lr, momentum)");
      }
      if (comma == std::string::npos) break;
      p = comma + 1;
    }
  }
  if (!have_lr) spec_error("sgd needs lr=X");
  if (loss == "xent") {
    o->loss = TrainOptions::Loss::kSoftmaxXent;
    o->labels = TrainOptions::Labels::kOneHot;
  } else if (loss == "xent-index") {
    o->loss = TrainOptions::Loss::kSoftmaxXent;
    o->labels = TrainOptions::Labels::kIndex;
  } else if (loss == "mse") {
    o->loss = TrainOptions::Loss::kMse;
  } else {
    spec_error("loss '" + loss + "' is not xent, xent-index or mse");
  }
}

Graph build_training_graph(const Graph& forward, const TrainOptions& options) {
  verify(forward, "forward graph");
  return Builder(forward, options).build();
}

}  // namespace tpusim::compiler
