// Passes on IR snippets: input text -> expected output text, plus the numerical
// facts each rewrite promises (fusions keep the bits, folding keeps the value).
#include <gtest/gtest.h>

#include <cmath>
#include <cstring>
#include <random>

#include "compiler/compiler.h"
#include "isa/numerics/bf16.h"

namespace tpusim::compiler {
namespace {

std::string run(const std::string& text, const std::string& pass) {
  Graph g = parse_graph(text);
  verify(g);
  run_passes(g, {pass_by_name(pass)});
  return print_graph(g);
}

HostTensor random_input(const Shape& s, uint32_t seed, float lo = -3.0f, float hi = 3.0f) {
  std::mt19937 rng(seed);
  std::uniform_real_distribution<float> d(lo, hi);
  HostTensor t;
  t.shape = s;
  for (int64_t k = 0; k < num_elements(s); ++k) t.f.push_back(d(rng));
  return t;
}

bool same_bits(const std::vector<float>& a, const std::vector<float>& b) {
  return a.size() == b.size() && std::memcmp(a.data(), b.data(), a.size() * 4) == 0;
}

const char* kLayerNorm = R"(graph ln {
  input %x : f32[3,200]
  const %g : f32[] = [0x3fc00000]
  const %b : f32[] = [0xbf000000]
  const %eps : f32[] = [0x3727c5ac]
  %m = reduce_mean(%x) {axes=[1], keepdims=1} : f32[3,1] #0
  %d = sub(%x, %m) : f32[3,200] #1
  %p = pow(%d) {exponent=2.0} : f32[3,200] #2
  %v = reduce_mean(%p) {axes=[1], keepdims=1} : f32[3,1] #3
  %ve = add(%v, %eps) : f32[3,1] #4
  %s = sqrt(%ve) : f32[3,1] #5
  %n = div(%d, %s) : f32[3,200] #6
  %sc = mul(%n, %g) : f32[3,200] #7
  %y = add(%b, %sc) : f32[3,200] #8
  output %y
}
)";

// gamma/beta must be per-channel vectors: make them [200] constants.
std::string layernorm_snippet() {
  std::string t = kLayerNorm;
  std::string g = "[", b = "[";
  for (int k = 0; k < 200; ++k) {
    char buf[16];
    const float gv = 0.5f + 0.01f * k, bv = -1.0f + 0.005f * k;
    uint32_t u;
    std::memcpy(&u, &gv, 4);
    std::snprintf(buf, sizeof buf, "0x%08x", u);
    g += (k ? ", " : "") + std::string(buf);
    std::memcpy(&u, &bv, 4);
    std::snprintf(buf, sizeof buf, "0x%08x", u);
    b += (k ? ", " : "") + std::string(buf);
  }
  t.replace(t.find("%g : f32[] = [0x3fc00000]"), 25, "%g : f32[200] = " + g + "]");
  t.replace(t.find("%b : f32[] = [0xbf000000]"), 25, "%b : f32[200] = " + b + "]");
  return t;
}

TEST(Passes, FuseLayerNormRewritesTheDecomposition) {
  const std::string in = layernorm_snippet();
  const std::string out = run(in, "fuse-layernorm");
  const std::string body = out.substr(out.find("  %"));
  EXPECT_EQ(body, "  %y = layernorm(%x, %g, %b) {axis=1, epsilon=1e-05} : f32[3,200] #9\n  output %y\n}\n");
  EXPECT_EQ(out.find("%eps"), std::string::npos);  // dead constant removed
}

TEST(Passes, FusedLayerNormKeepsTheBits) {
  // The layernorm recipe is the exporters' decomposition evaluated op by op, so
  // fusing must not change a single bit (docs/compiler.md, "layernorm").
  const Graph plain = parse_graph(layernorm_snippet());
  Graph fused = plain;
  run_passes(fused, {pass_by_name("fuse-layernorm")});
  ASSERT_EQ(fused.nodes.size(), 1u);
  const std::map<std::string, HostTensor> in = {{"x", random_input({3, 200}, 1)}};
  EXPECT_TRUE(same_bits(evaluate(plain, in, num::PrecisionPolicy::kDefault).at("y").f,
                        evaluate(fused, in, num::PrecisionPolicy::kDefault).at("y").f));
  // Under `bf16` the unfused graph stores every intermediate as bf16 and the fused
  // op keeps them in fp32 registers, so only the final store rounds: close, not equal.
  const auto a = evaluate(plain, in, num::PrecisionPolicy::kBf16).at("y").f;
  const auto b = evaluate(fused, in, num::PrecisionPolicy::kBf16).at("y").f;
  for (size_t k = 0; k < a.size(); ++k) EXPECT_NEAR(a[k], b[k], 0.05f * (1.0f + std::fabs(b[k])));
}

TEST(Passes, FuseLayerNormLeavesSharedIntermediatesAlone) {
  std::string in = layernorm_snippet();
  in.replace(in.find("  output %y"), 0, "  output %v\n");  // the variance is also a result
  const std::string out = run(in, "fuse-layernorm");
  EXPECT_EQ(out.find("layernorm("), std::string::npos);
}

const char* kGelu = R"(graph g {
  input %x : f32[3,130]
  const %sqrt2 : f32[] = [0x3fb504f3]
  const %one : f32[] = [0x3f800000]
  const %half : f32[] = [0x3f000000]
  %t = div(%x, %sqrt2) : f32[3,130] #0
  %e = erf(%t) : f32[3,130] #1
  %u = add(%e, %one) : f32[3,130] #2
  %v = mul(%x, %u) : f32[3,130] #3
  %y = mul(%v, %half) : f32[3,130] #4
  output %y
}
)";

TEST(Passes, FuseGelu) {
  EXPECT_EQ(run(kGelu, "fuse-gelu"), "graph g {\n  input %x : f32[3,130]\n  %y = gelu(%x) : f32[3,130] #5\n  output %y\n}\n");
  const Graph plain = parse_graph(kGelu);
  Graph fused = plain;
  run_passes(fused, {pass_by_name("fuse-gelu")});
  const std::map<std::string, HostTensor> in = {{"x", random_input({3, 130}, 2, -6, 6)}};
  EXPECT_TRUE(same_bits(evaluate(plain, in, num::PrecisionPolicy::kDefault).at("y").f,
                        evaluate(fused, in, num::PrecisionPolicy::kDefault).at("y").f));
  // The tanh approximation's constant is not sqrt(2): no fusion.
  std::string other = kGelu;
  other.replace(other.find("0x3fb504f3"), 10, "0x3fb504f4");
  EXPECT_EQ(run(other, "fuse-gelu").find("gelu("), std::string::npos);
}

const char* kConvBn = R"(graph cb {
  input %x : f32[1,2,5,5]
  const %w : f32[3,2,1,1] = [0x3f800000, 0xbf800000, 0x40000000, 0x3f000000, 0xc0400000, 0x3e800000]
  const %cb : f32[3] = [0x3f800000, 0x00000000, 0xbf800000]
  const %scale : f32[3] = [0x40000000, 0x3f000000, 0x3f800000]
  const %bias : f32[3] = [0x3f800000, 0xbf800000, 0x00000000]
  const %mean : f32[3] = [0x3e800000, 0xbf000000, 0x40000000]
  const %var : f32[3] = [0x40800000, 0x3f800000, 0x3e800000]
  %c = conv2d(%x, %w, %cb) {dilations=[1,1], groups=1, pads=[0,0,0,0], strides=[1,1]} : f32[1,3,5,5] #0
  %y = batchnorm(%c, %scale, %bias, %mean, %var) {epsilon=0.0} : f32[1,3,5,5] #1
  output %y
}
)";

TEST(Passes, FoldBatchNormIntoConv) {
  const Graph plain = parse_graph(kConvBn);
  Graph folded = plain;
  run_passes(folded, {pass_by_name("fold-batchnorm")});
  ASSERT_EQ(folded.nodes.size(), 1u);
  const Node& c = folded.nodes[0];
  EXPECT_EQ(c.op, OpKind::kConv2d);
  EXPECT_EQ(c.id, 0);
  EXPECT_EQ(c.output, "y");
  // Exact by construction of the constants (eps = 0, var a power of 4):
  // s = scale / sqrt(var) = {1, 0.5, 2}; w' = w * s; b' = (b - mean) * s + bias.
  const Constant* w = folded.find_constant(c.inputs[1]);
  const Constant* b = folded.find_constant(c.inputs[2]);
  ASSERT_TRUE(w && b);
  EXPECT_EQ(w->f, (std::vector<float>{1.0f, -1.0f, 1.0f, 0.25f, -6.0f, 0.5f}));
  EXPECT_EQ(b->f, (std::vector<float>{1.75f, -0.75f, -6.0f}));
  const std::map<std::string, HostTensor> in = {{"x", random_input({1, 2, 5, 5}, 3)}};
  const auto a = evaluate(plain, in, num::PrecisionPolicy::kDefault).at("y").f;
  const auto f = evaluate(folded, in, num::PrecisionPolicy::kDefault).at("y").f;
  for (size_t k = 0; k < a.size(); ++k) EXPECT_NEAR(a[k], f[k], 0.02f * (1.0f + std::fabs(a[k]))) << k;
}

TEST(Passes, FoldBatchNormNeedsConstantsAndASingleUse) {
  std::string shared = kConvBn;
  shared.replace(shared.find("  output %y"), 0, "  output %c\n");
  EXPECT_NE(run(shared, "fold-batchnorm").find("batchnorm("), std::string::npos);
}

const char* kResidual = R"(graph r {
  input %x : f32[1,2,4,4]
  input %skip : f32[1,2,4,4]
  const %w : f32[2,2,1,1] = [0x3f800000, 0x3f800000, 0x3f800000, 0x3f800000]
  %c = conv2d(%x, %w) {dilations=[1,1], groups=1, pads=[0,0,0,0], strides=[1,1]} : f32[1,2,4,4] #0
  %a = add(%c, %skip) : f32[1,2,4,4] #1
  %r = relu(%a) : f32[1,2,4,4] #2
  %t = tanh(%x) : f32[1,2,4,4] #3
  %u = sigmoid(%t) : f32[1,2,4,4] #4
  %v = exp(%t) : f32[1,2,4,4] #5
  output %r
  output %u
  output %v
}
)";

TEST(Passes, FuseElementwiseMarksGroups) {
  const std::string out = run(kResidual, "fuse-elementwise");
  // A pointwise conv's tiles are NCHW like %skip: the residual add and the relu join
  // the conv's group.
  EXPECT_NE(out.find("%a = add(%c, %skip) : f32[1,2,4,4] #1 fusion=#0\n"), std::string::npos) << out;
  EXPECT_NE(out.find("%r = relu(%a) : f32[1,2,4,4] #2 fusion=#0\n"), std::string::npos) << out;
  // Any other conv's tiles are NHWC (a strided 1x1 conv's too): the add roots its own
  // group (an elementwise chain), the relu joins it.
  std::string strided = kResidual;
  for (const auto& [from, to] : std::vector<std::pair<std::string, std::string>>{
           {"strides=[1,1]", "strides=[2,2]"}, {"f32[1,2,4,4] #0", "f32[1,2,2,2] #0"},
           {"%skip : f32[1,2,4,4]", "%skip : f32[1,2,2,2]"}, {"f32[1,2,4,4] #1", "f32[1,2,2,2] #1"},
           {"f32[1,2,4,4] #2", "f32[1,2,2,2] #2"}})
    strided.replace(strided.find(from), from.size(), to);
  const std::string out2 = run(strided, "fuse-elementwise");
  EXPECT_NE(out2.find("%a = add(%c, %skip) : f32[1,2,2,2] #1\n"), std::string::npos) << out2;
  EXPECT_NE(out2.find("%r = relu(%a) : f32[1,2,2,2] #2 fusion=#1\n"), std::string::npos) << out2;
  // A shifted conv (3x3, taps of 64 channels: 256 bytes) takes one operand of its shape
  // on its NCHW bands, then unary members only: the add and the relu join it, the mul
  // after them roots its own group.
  const std::string shifted = R"(graph s {
  input %x : f32[1,64,4,4]
  input %w : f32[2,64,3,3]
  input %skip : f32[1,2,4,4]
  %c = conv2d(%x, %w) {dilations=[1,1], groups=1, pads=[1,1,1,1], strides=[1,1]} : f32[1,2,4,4] #0
  %a = add(%skip, %c) : f32[1,2,4,4] #1
  %r = relu(%a) : f32[1,2,4,4] #2
  %m = mul(%r, %skip) : f32[1,2,4,4] #3
  output %m
}
)";
  const std::string out3 = run(shifted, "fuse-elementwise");
  EXPECT_NE(out3.find("%a = add(%skip, %c) : f32[1,2,4,4] #1 fusion=#0\n"), std::string::npos) << out3;
  EXPECT_NE(out3.find("%r = relu(%a) : f32[1,2,4,4] #2 fusion=#0\n"), std::string::npos) << out3;
  EXPECT_NE(out3.find("%m = mul(%r, %skip) : f32[1,2,4,4] #3\n"), std::string::npos) << out3;
  // %t has two users: the first goes on with its elementwise chain (whose kernel then
  // stores %t too), the second reads %t after it.
  EXPECT_NE(out.find("%u = sigmoid(%t) : f32[1,2,4,4] #4 fusion="), std::string::npos) << out;
  EXPECT_NE(out.find("%v = exp(%t) : f32[1,2,4,4] #5\n"), std::string::npos) << out;
  EXPECT_EQ(print_graph(parse_graph(out)), out);
}

TEST(Passes, PrecisionBf16RetypesAndRounds) {
  const char* text = R"(graph p {
  input %x : f32[2]
  input %i : i64[2]
  const %c : f32[2] = [0x3f808001, 0x3f818000]
  const %t : f32[3,2] = [0x3f800000, 0x3f800000, 0x3f800000, 0x3f800000, 0x3f800000, 0x3f800000]
  %a = add(%x, %c) : f32[2] #0
  %b = cast(%a) {to="f32"} : f32[2] #1
  %g = gather(%t, %i) {axis=0} : f32[2,2] #2
  output %b
  output %g
}
)";
  const std::string out = run(text, "precision-bf16");
  // 0x3f808001 is just above the halfway point 0x3f808000 -> rounds up; 0x3f818000
  // is a tie with an odd upper half -> rounds to even (up).
  EXPECT_EQ(out, R"(graph p {
  input %x : bf16[2]
  input %i : i64[2]
  const %c : bf16[2] = [0x3f810000, 0x3f820000]
  const %t : bf16[3,2] = [0x3f800000, 0x3f800000, 0x3f800000, 0x3f800000, 0x3f800000, 0x3f800000]
  %a = add(%x, %c) : bf16[2] #0
  %b = cast(%a) {to="bf16"} : bf16[2] #1
  %g = gather(%t, %i) {axis=0} : bf16[2,2] #2
  output %b
  output %g
}
)");
  EXPECT_EQ(run(text, "precision-default"), print_graph(parse_graph(text)));
}

TEST(Passes, DeadCodeAndIdentity) {
  const char* text = R"(graph d {
  input %x : f32[2]
  const %unused : f32[1] = [0x3f800000]
  %a = identity(%x) : f32[2] #0
  %b = relu(%a) : f32[2] #1
  %dead = exp(%b) : f32[2] #2
  %out = identity(%b) : f32[2] #3
  output %out
}
)";
  EXPECT_EQ(run(text, "dce"), "graph d {\n  input %x : f32[2]\n  %a = identity(%x) : f32[2] #0\n  %b = relu(%a) : f32[2] #1\n"
                               "  %out = identity(%b) : f32[2] #3\n  output %out\n}\n");
  Graph g = parse_graph(text);
  run_passes(g, {pass_by_name("fold-identity"), pass_by_name("dce")});
  EXPECT_EQ(print_graph(g), "graph d {\n  input %x : f32[2]\n  %b = relu(%x) : f32[2] #1\n  %out = identity(%b) : f32[2] #3\n  output %out\n}\n");
}

TEST(Passes, UnknownPassAndBrokenPassAreReported) {
  EXPECT_THROW(pass_by_name("no-such-pass"), CompileError);
  Graph g = parse_graph(kGelu);
  const Pass breaker{"breaker", [](Graph& gg) { gg.nodes[1].type.shape = {7}; }};
  try {
    run_passes(g, {breaker});
    FAIL();
  } catch (const CompileError& e) {
    EXPECT_NE(std::string(e.what()).find("after pass breaker: verifier:"), std::string::npos) << e.what();
  }
}

}  // namespace
}  // namespace tpusim::compiler
