// Each op below follows its recipe in docs/compiler.md literally: change one, change
// the other (and the lowering that must match it bit for bit).
#include "compiler/ref/evaluate.h"
#include "compiler/ref/replicas.h"

#include <cmath>

#include "compiler/passes/passes.h"
#include "isa/numerics/bf16.h"
#include "isa/numerics/conv.h"
#include "isa/numerics/fp32.h"
#include "isa/numerics/mxu.h"
#include "isa/numerics/vpu.h"

namespace tpusim::compiler {

namespace {

using num::ReduceOp;

// The value a tensor store of dtype `t` writes (precision.h, stored_value).
float store(DType t, float x) { return t == DType::kBf16 ? num::round_to_bf16(x) : num::flush(x); }

std::vector<int64_t> strides_of(const Shape& s) {
  std::vector<int64_t> st(s.size(), 1);
  for (size_t d = s.size(); d-- > 1;) st[d - 1] = st[d] * s[d];
  return st;
}

// Offsets into an operand of shape `in` for every element of the broadcast shape `out`.
std::vector<int64_t> broadcast_offsets(const Shape& in, const Shape& out) {
  const size_t r = out.size(), lead = r - in.size();
  std::vector<int64_t> st(r, 0);
  const auto ist = strides_of(in);
  for (size_t d = lead; d < r; ++d) st[d] = in[d - lead] == 1 ? 0 : ist[d - lead];
  const int64_t n = num_elements(out);
  std::vector<int64_t> offs(static_cast<size_t>(n));
  std::vector<int64_t> idx(r, 0);
  int64_t off = 0;
  for (int64_t e = 0; e < n; ++e) {
    offs[e] = off;
    for (size_t d = r; d-- > 0;) {
      if (++idx[d] < out[d]) {
        off += st[d];
        break;
      }
      off -= st[d] * (out[d] - 1);
      idx[d] = 0;
    }
  }
  return offs;
}

class Evaluator {
 public:
  Evaluator(const Graph& g, const EvalOptions& o) : g_(g), opt_(o) {}

  std::map<std::string, HostTensor> run(const std::map<std::string, HostTensor>& inputs) {
    bind(inputs);
    for (const Node& n : g_.nodes) step(n);
    return results();
  }

  // The pieces of run(), so evaluate_replicated can run replicas node by node in
  // lockstep and combine them at every all_reduce.
  void bind(const std::map<std::string, HostTensor>& inputs) {
    for (const GraphInput& in : g_.inputs) {
      auto it = inputs.find(in.name);
      if (it == inputs.end()) throw CompileError("input '" + in.name + "' (" + type_str(in.type) + ") is missing");
      const HostTensor& h = it->second;
      if (h.shape != in.type.shape)
        throw CompileError("input '" + in.name + "' has shape " + shape_str(h.shape) + ", the graph expects " + shape_str(in.type.shape));
      HostTensor t;
      t.dtype = in.type.dtype;
      t.shape = h.shape;
      if (in.type.dtype == DType::kI64) {
        if (h.dtype != DType::kI64) throw CompileError("input '" + in.name + "' must be i64 indices");
        t.i = h.i;
      } else {
        if (h.dtype == DType::kI64) throw CompileError("input '" + in.name + "' must be floating point");
        t.f.resize(h.f.size());
        for (size_t k = 0; k < h.f.size(); ++k) t.f[k] = store(t.dtype, h.f[k]);
      }
      vals_[in.name] = std::move(t);
    }
    for (const Constant& c : g_.constants) vals_[c.name] = HostTensor{c.type.dtype, c.type.shape, c.f, c.i};
  }

  void step(const Node& n) {
    HostTensor out;
    out.dtype = n.type.dtype;
    out.shape = n.type.shape;
    if (n.type.dtype != DType::kI64) out.f.assign(static_cast<size_t>(num_elements(n.type.shape)), 0.0f);
    compute(n, out);
    set(n.output, std::move(out));
  }

  // Stores a node result with the store rounding of its dtype.
  void set(const std::string& name, HostTensor out) {
    if (out.dtype != DType::kI64)
      for (float& v : out.f) v = store(out.dtype, v);
    vals_[name] = std::move(out);
  }
  const HostTensor& value(const std::string& name) const { return vals_.at(name); }

  std::map<std::string, HostTensor> results() const {
    std::map<std::string, HostTensor> result;
    for (const std::string& o : g_.outputs) result[o] = vals_.at(o);
    return result;
  }

 private:
  const Graph& g_;
  EvalOptions opt_;
  std::map<std::string, HostTensor> vals_;

  const HostTensor& in(const Node& n, size_t k) { return vals_.at(n.inputs[k]); }

  void compute(const Node& n, HostTensor& out) {
    switch (n.op) {
      case OpKind::kMatmul: return matmul(n, out);
      case OpKind::kConv2d: return conv(n, out);
      case OpKind::kAdd: case OpKind::kSub: case OpKind::kMul: case OpKind::kDiv: return binary(n, out);
      case OpKind::kSoftmax: return softmax(n, out);
      case OpKind::kLayerNorm: return layernorm(n, out);
      case OpKind::kBatchNorm: return batchnorm(n, out);
      case OpKind::kReduceSum: case OpKind::kReduceMean: case OpKind::kReduceMax: return reduce(n, out);
      case OpKind::kMaxPool: case OpKind::kAvgPool: return pool(n, out);
      case OpKind::kGlobalAvgPool: return global_avgpool(n, out);
      case OpKind::kTranspose: return transpose(n, out);
      case OpKind::kReshape: case OpKind::kFlatten: case OpKind::kIdentity: case OpKind::kCast:
      case OpKind::kAllReduce:  // one replica; evaluate_replicated combines several
      case OpKind::kAllGather: case OpKind::kReduceScatter: case OpKind::kAllToAll:
        out.f = in(n, 0).f;
        return;
      case OpKind::kConcat: return concat(n, out);
      case OpKind::kSlice: return slice(n, out);
      case OpKind::kPad: return pad(n, out);
      case OpKind::kGather: return gather(n, out);
      case OpKind::kReluGrad: return relu_grad(n, out);
      case OpKind::kMaxPoolGrad: return maxpool_grad(n, out);
      case OpKind::kReverse: return reverse(n, out);
      case OpKind::kIm2col: return im2col(n, out);
      default: return unary(n, out);
    }
  }

  void unary(const Node& n, HostTensor& out) {
    const std::vector<float>& x = in(n, 0).f;
    const float lo = n.op == OpKind::kClip ? n.attr_float("min") : 0.0f;
    const float hi = n.op == OpKind::kClip ? n.attr_float("max") : 0.0f;
    const float e = n.op == OpKind::kPow ? n.attr_float("exponent") : 0.0f;
    const float kSqrt2 = 1.41421356237309504880f;
    for (size_t k = 0; k < x.size(); ++k) {
      const float v = x[k];
      float y = 0.0f;
      switch (n.op) {
        case OpKind::kRelu: y = num::max(v, 0.0f); break;
        case OpKind::kGelu: y = num::mul(num::mul(v, num::add(num::erf(num::div(v, kSqrt2)), 1.0f)), 0.5f); break;
        case OpKind::kTanh: y = num::tanh(v); break;
        case OpKind::kSigmoid: y = num::div(1.0f, num::add(1.0f, num::exp(num::neg(v)))); break;
        case OpKind::kExp: y = num::exp(v); break;
        case OpKind::kLog: y = num::log(v); break;
        case OpKind::kSqrt: y = num::sqrt(v); break;
        case OpKind::kRsqrt: y = num::rsqrt(v); break;
        case OpKind::kErf: y = num::erf(v); break;
        case OpKind::kNeg: y = num::neg(v); break;
        case OpKind::kClip: y = num::min(num::max(v, lo), hi); break;
        case OpKind::kPow:
          y = e == 0.5f ? num::sqrt(v) : e == 1.0f ? num::flush(v) : e == 2.0f ? num::mul(v, v) : num::mul(num::mul(v, v), v);
          break;
        default: throw CompileError(std::string("evaluator: no recipe for ") + op_name(n.op));
      }
      out.f[k] = y;
    }
  }

  void binary(const Node& n, HostTensor& out) {
    const HostTensor &a = in(n, 0), &b = in(n, 1);
    const auto oa = broadcast_offsets(a.shape, out.shape), ob = broadcast_offsets(b.shape, out.shape);
    for (size_t k = 0; k < out.f.size(); ++k) {
      const float x = a.f[oa[k]], y = b.f[ob[k]];
      switch (n.op) {
        case OpKind::kAdd: out.f[k] = num::add(x, y); break;
        case OpKind::kSub: out.f[k] = num::sub(x, y); break;
        case OpKind::kMul: out.f[k] = num::mul(x, y); break;
        default: out.f[k] = num::div(x, y); break;
      }
    }
  }

  // Batched matmul: each batch element is one mxu_matmul of bf16 operands (rounded
  // from the stored values as they enter the MXU), then alpha, then the bias.
  void matmul(const Node& n, HostTensor& out) {
    const HostTensor &a = in(n, 0), &b = in(n, 1);
    const bool ta = n.attr_int("trans_a") != 0, tb = n.attr_int("trans_b") != 0;
    const size_t ra = a.shape.size(), ro = out.shape.size();
    const int64_t m = out.shape[ro - 2], nn = out.shape[ro - 1];
    const int64_t k = ta ? a.shape[ra - 2] : a.shape[ra - 1];
    const Shape batch(out.shape.begin(), out.shape.end() - 2);
    const auto offa = broadcast_offsets(Shape(a.shape.begin(), a.shape.end() - 2), batch);
    const auto offb = broadcast_offsets(Shape(b.shape.begin(), b.shape.end() - 2), batch);
    std::vector<uint16_t> am(static_cast<size_t>(m * k)), bm(static_cast<size_t>(k * nn));
    for (size_t bi = 0; bi < offa.size(); ++bi) {
      const float* pa = a.f.data() + offa[bi] * m * k;
      const float* pb = b.f.data() + offb[bi] * k * nn;
      for (int64_t i = 0; i < m; ++i)
        for (int64_t j = 0; j < k; ++j) am[i * k + j] = num::mxu_operand(ta ? pa[j * m + i] : pa[i * k + j]);
      for (int64_t i = 0; i < k; ++i)
        for (int64_t j = 0; j < nn; ++j) bm[i * nn + j] = num::mxu_operand(tb ? pb[j * k + i] : pb[i * nn + j]);
      num::MatmulArgs args;
      args.a = am.data();
      args.lda = static_cast<size_t>(k);
      args.w = bm.data();
      args.ldw = static_cast<size_t>(nn);
      args.c = out.f.data() + bi * m * nn;
      args.ldc = static_cast<size_t>(nn);
      args.m = static_cast<int>(m);
      args.k = static_cast<int>(k);
      args.n = static_cast<int>(nn);
      args.rows = opt_.mxu_rows;
      num::mxu_matmul(args);
    }
    const float alpha = n.has_attr("alpha") ? n.attr_float("alpha") : 1.0f;
    const float beta = n.has_attr("beta") ? n.attr_float("beta") : 1.0f;
    if (alpha != 1.0f)
      for (float& v : out.f) v = num::mul(alpha, v);
    if (n.inputs.size() == 3) {
      const HostTensor& c = in(n, 2);
      const auto oc = broadcast_offsets(c.shape, out.shape);
      for (size_t e = 0; e < out.f.size(); ++e) {
        const float cv = beta != 1.0f ? num::mul(beta, c.f[oc[e]]) : c.f[oc[e]];
        out.f[e] = num::add(out.f[e], cv);
      }
    }
  }

  // NCHW/OIHW at the graph level; the contract's conv is NHWC x HWIO.
  void conv(const Node& n, HostTensor& out) {
    const HostTensor &x = in(n, 0), &w = in(n, 1);
    num::Conv2dShape s;
    s.n = static_cast<int>(x.shape[0]);
    s.cin = static_cast<int>(x.shape[1]);
    s.h = static_cast<int>(x.shape[2]);
    s.w = static_cast<int>(x.shape[3]);
    s.cout = static_cast<int>(w.shape[0]);
    s.kh = static_cast<int>(w.shape[2]);
    s.kw = static_cast<int>(w.shape[3]);
    const auto& st = n.attr_ints("strides");
    const auto& pads = n.attr_ints("pads");
    const auto& dil = n.attr_ints("dilations");
    s.stride_h = static_cast<int>(st[0]);
    s.stride_w = static_cast<int>(st[1]);
    s.pad_top = static_cast<int>(pads[0]);
    s.pad_left = static_cast<int>(pads[1]);
    s.pad_bottom = static_cast<int>(pads[2]);
    s.pad_right = static_cast<int>(pads[3]);
    s.dilation_h = static_cast<int>(dil[0]);
    s.dilation_w = static_cast<int>(dil[1]);
    s.groups = n.has_attr("groups") ? static_cast<int>(n.attr_int("groups")) : 1;
    const int cin_g = s.cin / s.groups;
    std::vector<uint16_t> xh(x.f.size()), wh(w.f.size());
    for (int b = 0; b < s.n; ++b)
      for (int c = 0; c < s.cin; ++c)
        for (int h = 0; h < s.h; ++h)
          for (int ww = 0; ww < s.w; ++ww)
            xh[((static_cast<size_t>(b) * s.h + h) * s.w + ww) * s.cin + c] =
                num::mxu_operand(x.f[((static_cast<size_t>(b) * s.cin + c) * s.h + h) * s.w + ww]);
    for (int o = 0; o < s.cout; ++o)
      for (int c = 0; c < cin_g; ++c)
        for (int i = 0; i < s.kh; ++i)
          for (int j = 0; j < s.kw; ++j)
            wh[((static_cast<size_t>(i) * s.kw + j) * cin_g + c) * s.cout + o] =
                num::mxu_operand(w.f[((static_cast<size_t>(o) * cin_g + c) * s.kh + i) * s.kw + j]);
    const int oh = static_cast<int>(out.shape[2]), ow = static_cast<int>(out.shape[3]);
    std::vector<float> yh(out.f.size());
    num::Conv2dArgs args;
    args.shape = s;
    args.x = xh.data();
    args.w = wh.data();
    args.y = yh.data();
    args.bias = n.inputs.size() == 3 ? in(n, 2).f.data() : nullptr;
    args.rows = opt_.mxu_rows;
    num::conv2d(args);
    for (int b = 0; b < s.n; ++b)
      for (int o = 0; o < s.cout; ++o)
        for (int h = 0; h < oh; ++h)
          for (int ww = 0; ww < ow; ++ww)
            out.f[((static_cast<size_t>(b) * s.cout + o) * oh + h) * ow + ww] =
                yh[((static_cast<size_t>(b) * oh + h) * ow + ww) * s.cout + o];
  }

  // Reduction over `len` elements at `stride`: along lanes (reduce_row) when the
  // elements are contiguous, else down sublanes (reduce_column).
  static float reduce_line(ReduceOp op, const float* p, int64_t len, int64_t stride) {
    return stride == 1 ? num::reduce_row(op, p, static_cast<size_t>(len))
                       : num::reduce_column(op, p, static_cast<size_t>(len), static_cast<size_t>(stride));
  }

  void softmax(const Node& n, HostTensor& out) {
    const HostTensor& x = in(n, 0);
    const int64_t axis = n.attr_int("axis");
    const int64_t len = x.shape[axis];
    const int64_t inner = num_elements(Shape(x.shape.begin() + axis + 1, x.shape.end()));
    const int64_t outer = num_elements(Shape(x.shape.begin(), x.shape.begin() + axis));
    std::vector<float> e(static_cast<size_t>(len * inner));
    for (int64_t o = 0; o < outer; ++o) {
      const float* px = x.f.data() + o * len * inner;
      for (int64_t j = 0; j < inner; ++j) {
        const float m = reduce_line(ReduceOp::kMax, px + j, len, inner);
        for (int64_t i = 0; i < len; ++i) e[i * inner + j] = num::exp(num::sub(px[i * inner + j], m));
        const float s = reduce_line(ReduceOp::kSum, e.data() + j, len, inner);
        for (int64_t i = 0; i < len; ++i) out.f[o * len * inner + i * inner + j] = num::div(e[i * inner + j], s);
      }
    }
  }

  void layernorm(const Node& n, HostTensor& out) {
    const HostTensor &x = in(n, 0), &gamma = in(n, 1), &beta = in(n, 2);
    const float eps = n.attr_float("epsilon");
    const int64_t len = x.shape.back(), rows = num_elements(x.shape) / len;
    const float fn = static_cast<float>(len);
    std::vector<float> d(static_cast<size_t>(len));
    for (int64_t r = 0; r < rows; ++r) {
      const float* px = x.f.data() + r * len;
      const float mean = num::div(num::reduce_row(ReduceOp::kSum, px, len), fn);
      for (int64_t i = 0; i < len; ++i) d[i] = num::sub(px[i], mean);
      std::vector<float> sq(static_cast<size_t>(len));
      for (int64_t i = 0; i < len; ++i) sq[i] = num::mul(d[i], d[i]);
      const float var = num::div(num::reduce_row(ReduceOp::kSum, sq.data(), len), fn);
      const float den = num::sqrt(num::add(var, eps));
      for (int64_t i = 0; i < len; ++i) out.f[r * len + i] = num::add(num::mul(num::div(d[i], den), gamma.f[i]), beta.f[i]);
    }
  }

  void batchnorm(const Node& n, HostTensor& out) {
    const HostTensor& x = in(n, 0);
    const std::vector<float>&scale = in(n, 1).f, &bias = in(n, 2).f, &mean = in(n, 3).f, &var = in(n, 4).f;
    const float eps = n.attr_float("epsilon");
    const int64_t c = x.shape[1], inner = num_elements(x.shape) / x.shape[0] / c;
    for (int64_t ch = 0; ch < c; ++ch) {
      const float s = num::div(scale[ch], num::sqrt(num::add(var[ch], eps)));
      for (int64_t b = 0; b < x.shape[0]; ++b)
        for (int64_t i = 0; i < inner; ++i) {
          const size_t k = static_cast<size_t>((b * c + ch) * inner + i);
          out.f[k] = num::add(num::mul(num::sub(x.f[k], mean[ch]), s), bias[ch]);
        }
    }
  }

  void reduce(const Node& n, HostTensor& out) {
    const HostTensor& x = in(n, 0);
    const auto& axes = n.attr_ints("axes");
    const int64_t outer = num_elements(Shape(x.shape.begin(), x.shape.begin() + axes.front()));
    const int64_t len = num_elements(Shape(x.shape.begin() + axes.front(), x.shape.begin() + axes.back() + 1));
    const int64_t inner = num_elements(Shape(x.shape.begin() + axes.back() + 1, x.shape.end()));
    const ReduceOp op = n.op == OpKind::kReduceMax ? ReduceOp::kMax : ReduceOp::kSum;
    for (int64_t o = 0; o < outer; ++o)
      for (int64_t j = 0; j < inner; ++j) {
        float r = reduce_line(op, x.f.data() + o * len * inner + j, len, inner);
        if (n.op == OpKind::kReduceMean) r = num::div(r, static_cast<float>(len));
        out.f[o * inner + j] = r;
      }
  }

  // Window taps in row-major (kh, kw) order, gathered into one row and reduced with
  // reduce_row. Max and average with count_include_pad=0 skip padded taps; average
  // with count_include_pad=1 keeps them as +0.0.
  void pool(const Node& n, HostTensor& out) {
    const HostTensor& x = in(n, 0);
    const auto& k = n.attr_ints("kernel");
    const auto& st = n.attr_ints("strides");
    const auto& pads = n.attr_ints("pads");
    const bool is_max = n.op == OpKind::kMaxPool;
    const bool include_pad = !is_max && n.attr_int("count_include_pad") != 0;
    const int64_t H = x.shape[2], W = x.shape[3], OH = out.shape[2], OW = out.shape[3];
    std::vector<float> taps(static_cast<size_t>(k[0] * k[1]));
    for (int64_t p = 0; p < x.shape[0] * x.shape[1]; ++p) {
      const float* px = x.f.data() + p * H * W;
      for (int64_t oh = 0; oh < OH; ++oh)
        for (int64_t ow = 0; ow < OW; ++ow) {
          size_t cnt = 0;
          for (int64_t i = 0; i < k[0]; ++i)
            for (int64_t j = 0; j < k[1]; ++j) {
              const int64_t h = oh * st[0] - pads[0] + i, w = ow * st[1] - pads[1] + j;
              if (h >= 0 && h < H && w >= 0 && w < W) taps[cnt++] = px[h * W + w];
              else if (include_pad) taps[cnt++] = 0.0f;
            }
          float r = num::reduce_row(is_max ? ReduceOp::kMax : ReduceOp::kSum, taps.data(), cnt);
          if (!is_max) r = num::div(r, static_cast<float>(cnt));
          out.f[(p * OH + oh) * OW + ow] = r;
        }
    }
  }

  void global_avgpool(const Node& n, HostTensor& out) {
    const HostTensor& x = in(n, 0);
    const int64_t len = x.shape[2] * x.shape[3];
    for (int64_t p = 0; p < x.shape[0] * x.shape[1]; ++p)
      out.f[p] = num::div(num::reduce_row(ReduceOp::kSum, x.f.data() + p * len, static_cast<size_t>(len)), static_cast<float>(len));
  }

  void transpose(const Node& n, HostTensor& out) {
    const HostTensor& x = in(n, 0);
    const auto& perm = n.attr_ints("perm");
    const auto xs = strides_of(x.shape);
    Shape permuted_strides(perm.size());
    for (size_t d = 0; d < perm.size(); ++d) permuted_strides[d] = xs[perm[d]];
    std::vector<int64_t> idx(out.shape.size(), 0);
    int64_t off = 0;
    for (size_t e = 0; e < out.f.size(); ++e) {
      out.f[e] = x.f[off];
      for (size_t d = out.shape.size(); d-- > 0;) {
        if (++idx[d] < out.shape[d]) {
          off += permuted_strides[d];
          break;
        }
        off -= permuted_strides[d] * (out.shape[d] - 1);
        idx[d] = 0;
      }
    }
  }

  void concat(const Node& n, HostTensor& out) {
    const int64_t axis = n.attr_int("axis");
    const int64_t outer = num_elements(Shape(out.shape.begin(), out.shape.begin() + axis));
    const int64_t inner = num_elements(Shape(out.shape.begin() + axis + 1, out.shape.end()));
    int64_t at = 0;
    for (size_t k = 0; k < n.inputs.size(); ++k) {
      const HostTensor& x = in(n, k);
      const int64_t chunk = x.shape[axis] * inner;
      for (int64_t o = 0; o < outer; ++o)
        std::copy(x.f.begin() + o * chunk, x.f.begin() + (o + 1) * chunk, out.f.begin() + o * out.shape[axis] * inner + at);
      at += chunk;
    }
  }

  void slice(const Node& n, HostTensor& out) {
    const HostTensor& x = in(n, 0);
    const auto& starts = n.attr_ints("starts");
    const auto& steps = n.attr_ints("steps");
    const auto xs = strides_of(x.shape);
    const size_t r = out.shape.size();
    std::vector<int64_t> idx(r, 0);
    for (size_t e = 0; e < out.f.size(); ++e) {
      int64_t off = 0;
      for (size_t d = 0; d < r; ++d) off += (starts[d] + idx[d] * steps[d]) * xs[d];
      out.f[e] = x.f[off];
      for (size_t d = r; d-- > 0;) {
        if (++idx[d] < out.shape[d]) break;
        idx[d] = 0;
      }
    }
  }

  void pad(const Node& n, HostTensor& out) {
    const HostTensor& x = in(n, 0);
    const auto& p = n.attr_ints("pads");
    const float value = n.attr_float("value");
    const size_t r = x.shape.size();
    std::fill(out.f.begin(), out.f.end(), value);
    const auto os = strides_of(out.shape);
    std::vector<int64_t> idx(r, 0);
    for (size_t e = 0; e < x.f.size(); ++e) {
      int64_t off = 0;
      for (size_t d = 0; d < r; ++d) off += (idx[d] + p[d]) * os[d];
      out.f[off] = x.f[e];
      for (size_t d = r; d-- > 0;) {
        if (++idx[d] < x.shape[d]) break;
        idx[d] = 0;
      }
    }
  }

  // relu_grad(dy, x) = x > +0.0 ? dy : +0.0 (cmp_lt(+0.0, x); NaN x gives +0.0).
  void relu_grad(const Node& n, HostTensor& out) {
    const std::vector<float>&dy = in(n, 0).f, &x = in(n, 1).f;
    for (size_t k = 0; k < out.f.size(); ++k) out.f[k] = num::cmp_lt(0.0f, x[k]) ? dy[k] : 0.0f;
  }

  // maxpool_grad(dy, x, y): per (n, c) plane, output pixels in row-major order; each
  // sends dy to the first valid tap (row-major in (kh, kw)) with cmp_eq(x_tap, y).
  // A tap's first contribution is dy itself, later ones (overlapping windows) are
  // num::add-ed in output-pixel order; taps no window picked are +0.0.
  void maxpool_grad(const Node& n, HostTensor& out) {
    const HostTensor &dy = in(n, 0), &x = in(n, 1), &y = in(n, 2);
    const auto& k = n.attr_ints("kernel");
    const auto& st = n.attr_ints("strides");
    const auto& pads = n.attr_ints("pads");
    const int64_t H = x.shape[2], W = x.shape[3], OH = dy.shape[2], OW = dy.shape[3];
    std::vector<bool> hit(out.f.size(), false);
    for (int64_t p = 0; p < x.shape[0] * x.shape[1]; ++p)
      for (int64_t oh = 0; oh < OH; ++oh)
        for (int64_t ow = 0; ow < OW; ++ow) {
          const size_t o = static_cast<size_t>((p * OH + oh) * OW + ow);
          bool done = false;
          for (int64_t i = 0; i < k[0] && !done; ++i)
            for (int64_t j = 0; j < k[1] && !done; ++j) {
              const int64_t h = oh * st[0] - pads[0] + i, w = ow * st[1] - pads[1] + j;
              if (h < 0 || h >= H || w < 0 || w >= W) continue;
              const size_t t = static_cast<size_t>((p * H + h) * W + w);
              if (!num::cmp_eq(x.f[t], y.f[o])) continue;
              out.f[t] = hit[t] ? num::add(out.f[t], dy.f[o]) : dy.f[o];
              hit[t] = true;
              done = true;
            }
        }
  }

  void reverse(const Node& n, HostTensor& out) {
    const HostTensor& x = in(n, 0);
    const auto xs = strides_of(x.shape);
    std::vector<bool> rev(x.shape.size(), false);
    for (int64_t a : n.attr_ints("axes")) rev[static_cast<size_t>(a)] = true;
    std::vector<int64_t> idx(x.shape.size(), 0);
    for (size_t e = 0; e < out.f.size(); ++e) {
      int64_t off = 0;
      for (size_t d = 0; d < idx.size(); ++d) off += (rev[d] ? x.shape[d] - 1 - idx[d] : idx[d]) * xs[d];
      out.f[e] = x.f[static_cast<size_t>(off)];
      for (size_t d = idx.size(); d-- > 0;) {
        if (++idx[d] < x.shape[d]) break;
        idx[d] = 0;
      }
    }
  }

  // im2col rows (n, oh, ow), columns (kh*KW + kw)*C + c: the conv recipe's reduction
  // order; padding taps are +0.0.
  void im2col(const Node& n, HostTensor& out) {
    const HostTensor& x = in(n, 0);
    const auto& k = n.attr_ints("kernel");
    const auto& st = n.attr_ints("strides");
    const auto& pads = n.attr_ints("pads");
    const auto& dil = n.attr_ints("dilations");
    const int64_t C = x.shape[1], H = x.shape[2], W = x.shape[3];
    const int64_t OH = (H + pads[0] + pads[2] - dil[0] * (k[0] - 1) - 1) / st[0] + 1;
    const int64_t OW = (W + pads[1] + pads[3] - dil[1] * (k[1] - 1) - 1) / st[1] + 1;
    const int64_t K = k[0] * k[1] * C;
    for (int64_t b = 0; b < x.shape[0]; ++b)
      for (int64_t oh = 0; oh < OH; ++oh)
        for (int64_t ow = 0; ow < OW; ++ow)
          for (int64_t i = 0; i < k[0]; ++i)
            for (int64_t j = 0; j < k[1]; ++j) {
              const int64_t h = oh * st[0] - pads[0] + i * dil[0], w = ow * st[1] - pads[1] + j * dil[1];
              if (h < 0 || h >= H || w < 0 || w >= W) continue;
              for (int64_t c = 0; c < C; ++c)
                out.f[static_cast<size_t>(((b * OH + oh) * OW + ow) * K + (i * k[1] + j) * C + c)] =
                    x.f[static_cast<size_t>(((b * C + c) * H + h) * W + w)];
            }
  }

  void gather(const Node& n, HostTensor& out) {
    const HostTensor &x = in(n, 0), &ix = in(n, 1);
    const int64_t axis = n.attr_int("axis");
    const int64_t outer = num_elements(Shape(x.shape.begin(), x.shape.begin() + axis));
    const int64_t len = x.shape[axis];
    const int64_t inner = num_elements(Shape(x.shape.begin() + axis + 1, x.shape.end()));
    const int64_t ni = static_cast<int64_t>(ix.i.size());
    for (int64_t o = 0; o < outer; ++o)
      for (int64_t q = 0; q < ni; ++q) {
        int64_t v = ix.i[q];
        if (v < 0) v += len;
        if (v < 0 || v >= len)
          throw CompileError("node #" + std::to_string(n.id) + " (gather): index " + std::to_string(ix.i[q]) + " out of range [0," + std::to_string(len) + ")");
        std::copy(x.f.begin() + (o * len + v) * inner, x.f.begin() + (o * len + v + 1) * inner, out.f.begin() + (o * ni + q) * inner);
      }
  }
};

}  // namespace

std::map<std::string, HostTensor> evaluate(const Graph& graph, const std::map<std::string, HostTensor>& inputs,
                                           num::PrecisionPolicy policy, const EvalOptions& options) {
  Graph g = graph;
  apply_precision(g, policy);
  verify(g, "evaluate");
  return Evaluator(g, options).run(inputs);
}

std::map<std::string, HostTensor> evaluate_replicated(const Graph& graph, const std::map<std::string, HostTensor>& inputs,
                                                      num::PrecisionPolicy policy, const ReplicaSpec& spec,
                                                      const EvalOptions& options) {
  if (spec.replicas <= 1) return evaluate(graph, inputs, policy, options);
  check_replicas(spec);  // what the lowering refuses has no reference either
  Graph global = graph;
  apply_precision(global, policy);
  verify(global, "evaluate");
  const ReplicaGraph rg = replica_graph(global, spec);
  const int R = spec.replicas;
  std::vector<Evaluator> ev;
  ev.reserve(static_cast<size_t>(R));
  for (int r = 0; r < R; ++r) ev.emplace_back(rg.graph, options);
  for (int r = 0; r < R; ++r) {
    std::map<std::string, HostTensor> mine;
    for (const GraphInput& in : global.inputs) {
      auto it = inputs.find(in.name);
      if (it == inputs.end()) throw CompileError("input '" + in.name + "' (" + type_str(in.type) + ") is missing");
      if (it->second.shape != in.type.shape)
        throw CompileError("input '" + in.name + "' has shape " + shape_str(it->second.shape) + ", the graph expects " +
                           shape_str(in.type.shape));
      mine[in.name] = rg.batched_inputs.count(in.name) ? batch_slice(it->second, r, R) : it->second;
    }
    ev[static_cast<size_t>(r)].bind(mine);
  }
  for (const Node& n : rg.graph.nodes) {
    if (n.op != OpKind::kAllReduce && n.op != OpKind::kAllGather && n.op != OpKind::kReduceScatter &&
        n.op != OpKind::kAllToAll) {
      for (auto& e : ev) e.step(n);
      continue;
    }
    std::vector<std::vector<float>> x;
    for (const auto& e : ev) x.push_back(e.value(n.inputs[0]).f);
    std::vector<std::vector<float>> y =
        n.op == OpKind::kAllReduce ? all_reduce_values(spec, x) : direct_collective_values(n.op, x);
    for (int r = 0; r < R; ++r) {
      HostTensor out;
      out.dtype = n.type.dtype;
      out.shape = n.type.shape;
      out.f = std::move(y[static_cast<size_t>(r)]);
      ev[static_cast<size_t>(r)].set(n.output, std::move(out));
    }
  }
  std::map<std::string, HostTensor> result;
  for (const std::string& o : global.outputs) {
    if (!rg.batched_outputs.count(o)) {
      result[o] = ev[0].value(o);
      continue;
    }
    std::vector<HostTensor> parts;
    for (const auto& e : ev) parts.push_back(e.value(o));
    result[o] = batch_concat(parts);
  }
  return result;
}

}  // namespace tpusim::compiler
