// Graph IR: exact text round-trip over every op, shape/dtype inference against
// hand-computed shapes, and the verifier's and parser's rejections.
#include <gtest/gtest.h>

#include <cmath>
#include <cstdio>
#include <cstring>
#include <random>
#include <set>

#include "compiler/ir/graph.h"

namespace tpusim::compiler {
namespace {

// One graph that uses every op kind (checked below), with attribute values that
// are awkward to print: tiny and huge floats, inf, negative ints, quoted names.
const char* kEveryOp = R"(graph every_op {
  input %x : f32[2,3,8,8]
  input %m : f32[16,32]
  input %"ids:0" : i64[2,5]
  const %w : f32[4,3,3,3] = [)"
#define W27 "0x3f800000, 0x3f800000, 0x3f800000, 0x3f800000, 0x3f800000, 0x3f800000, 0x3f800000, 0x3f800000, 0x3f800000, "
                       W27 W27 W27 W27 W27 W27 W27 W27 W27 W27 W27
                       "0x3f800000, 0x3f800000, 0x3f800000, 0x3f800000, 0x3f800000, 0x3f800000, 0x3f800000, 0x3f800000, 0x3f800000]"
                       R"(
  const %wm : f32[32,8] = [)"
                       W27 W27 W27 W27 W27 W27 W27 W27 W27 W27 W27 W27 W27 W27 W27 W27 W27 W27 W27 W27 W27 W27 W27 W27 W27 W27 W27 W27
                       "0x00000001, 0x80000000, 0x7fc00000, 0xff800000]"
                       R"(
  const %c4 : f32[4] = [0x3f800000, 0x40000000, 0x40400000, 0x40800000]
  const %table : f32[10,3] = [0x00000000, 0x3f800000, 0x40000000, 0x00000000, 0x3f800000, 0x40000000, 0x00000000, 0x3f800000, 0x40000000, 0x00000000, 0x3f800000, 0x40000000, 0x00000000, 0x3f800000, 0x40000000, 0x00000000, 0x3f800000, 0x40000000, 0x00000000, 0x3f800000, 0x40000000, 0x00000000, 0x3f800000, 0x40000000, 0x00000000, 0x3f800000, 0x40000000, 0x00000000, 0x3f800000, 0x40000000]
  const %idx : i64[3] = [-1, 0, 9223372036854775807]
  %conv = conv2d(%x, %w, %c4) {dilations=[1,1], groups=1, pads=[1,1,1,1], strides=[1,1]} : f32[2,4,8,8] #0
  %bn = batchnorm(%conv, %c4, %c4, %c4, %c4) {epsilon=1e-05} : f32[2,4,8,8] #1
  %r = relu(%bn) : f32[2,4,8,8] #2 fusion=#0
  %mp = maxpool(%r) {kernel=[3,3], pads=[1,1,1,1], strides=[2,2]} : f32[2,4,4,4] #3
  %ap = avgpool(%mp) {count_include_pad=1, kernel=[2,2], pads=[0,0,0,0], strides=[2,2]} : f32[2,4,2,2] #4
  %gp = global_avgpool(%ap) : f32[2,4,1,1] #5
  %fl = flatten(%gp) {axis=1} : f32[2,4] #6
  %mm = matmul(%m, %wm) {alpha=0.5, beta=3e+38, trans_a=0, trans_b=0} : f32[16,8] #7
  %bmm = matmul(%x, %x) {trans_b=1} : f32[2,3,8,8] #8
  %a = add(%mm, %mm) : f32[16,8] #9
  %s = sub(%a, %mm) : f32[16,8] #10
  %mu = mul(%s, %a) : f32[16,8] #11
  %d = div(%mu, %a) : f32[16,8] #12
  %p = pow(%d) {exponent=0.5} : f32[16,8] #13
  %g = gelu(%p) : f32[16,8] #14
  %t = tanh(%g) : f32[16,8] #15
  %sg = sigmoid(%t) : f32[16,8] #16
  %e = exp(%sg) : f32[16,8] #17
  %l = log(%e) : f32[16,8] #18
  %sq = sqrt(%l) : f32[16,8] #19
  %rs = rsqrt(%sq) : f32[16,8] #20
  %er = erf(%rs) : f32[16,8] #21
  %ng = neg(%er) : f32[16,8] #22
  %cl = clip(%ng) {max=inf, min=-3.4028235e+38} : f32[16,8] #23
  %sm = softmax(%cl) {axis=1} : f32[16,8] #24
  %ln = layernorm(%sm, %fl8, %fl8) {axis=1, epsilon=1e-12} : f32[16,8] #26
  %rsum = reduce_sum(%ln) {axes=[0,1], keepdims=0} : f32[] #27
  %rmean = reduce_mean(%bmm) {axes=[2,3], keepdims=1} : f32[2,3,1,1] #28
  %rmax = reduce_max(%bmm) {axes=[1], keepdims=0} : f32[2,8,8] #29
  %tr = transpose(%rmax) {perm=[2,0,1]} : f32[8,2,8] #30
  %rsh = reshape(%tr) {shape=[16,8]} : f32[16,8] #31
  %cc = concat(%rsh, %ln, %rsh) {axis=0} : f32[48,8] #32
  %sl = slice(%cc) {ends=[48,7], starts=[1,0], steps=[3,2]} : f32[16,4] #33
  %pd = pad(%sl) {pads=[0,1,2,0], value=-0.5} : f32[18,5] #34
  %ga = gather(%table, %"ids:0") {axis=0} : f32[2,5,3] #35
  %ca = cast(%ga) {to="bf16"} : bf16[2,5,3] #36
  %id = identity(%ca) : bf16[2,5,3] #37
  %ar = all_reduce(%rsh) : f32[16,8] #38
  %rg = relu_grad(%ar, %rsh) : f32[16,8] #39
  %rv = reverse(%rg) {axes=[0]} : f32[16,8] #40
  %ic = im2col(%x) {dilations=[1,1], kernel=[3,3], pads=[1,1,1,1], strides=[1,1]} : f32[128,27] #41
  %mg = maxpool_grad(%mp, %r, %mp) {kernel=[3,3], pads=[1,1,1,1], strides=[2,2]} : f32[2,4,8,8] #42
  %agt = all_gather(%rsh) {replicas=2} : f32[32,8] #43
  %rsc = reduce_scatter(%agt) {replicas=4} : f32[8,8] #44
  %a2a = all_to_all(%rsc) {replicas=2} : f32[8,8] #45
  output %id
  output %pd
  output %rsum
  output %rmean
  output %rv
  output %ic
  output %mg
  output %a2a
}
)";

std::string every_op_text() {
  // %fl8 is a constant [8] for layernorm; spliced in so the table above stays readable.
  std::string t = kEveryOp;
  const std::string anchor = "  const %idx";
  t.insert(t.find(anchor), "  const %fl8 : f32[8] = [0x3f800000, 0x3f800000, 0x3f800000, 0x3f800000, 0x3f800000, 0x3f800000, 0x3f800000, 0x3f800000]\n");
  return t;
}

TEST(GraphIr, EveryOpRoundTripsExactly) {
  const std::string text = every_op_text();
  const Graph g = parse_graph(text, "every_op.ir");
  verify(g);
  std::set<OpKind> seen;
  for (const Node& n : g.nodes) seen.insert(n.op);
  for (int k = 0; k <= static_cast<int>(OpKind::kIm2col); ++k)
    EXPECT_TRUE(seen.count(static_cast<OpKind>(k))) << "no node of op " << op_name(static_cast<OpKind>(k));
  const std::string printed = print_graph(g);
  EXPECT_EQ(printed, text);  // the snippet is written in canonical form
  EXPECT_EQ(print_graph(parse_graph(printed)), printed);
}

// Bounded random mutation of the every-op text through the parser and the verifier:
// any text gives a graph or a CompileError naming the file, never a crash, a hang or
// another exception, and a graph that both accept prints and parses back to itself.
TEST(GraphIr, MutatedTextGivesAGraphOrACompileError) {
  static const char* kTokens[] = {"%", "#", "{", "}", "[", "]", "(", ")", ",", ":", "=", "\"", "\n", "//",
                                  "-1", "0", "1099511627776", "99999999999999999999", "0x7fc00000", "nan",
                                  "f32", "bf16", "i64", "#0", "fusion=#1", "input", "const", "output", "\x1e"};
  const std::string base = every_op_text();
  std::mt19937 g(7);
  int accepted = 0, rejected = 0;
  for (int i = 0; i < 20000; ++i) {
    std::string t = base;
    for (int m = 1 + static_cast<int>(g() % 4); m > 0; --m) {
      const size_t pos = g() % t.size();
      switch (g() % 5) {
        case 0: t[pos] = static_cast<char>(g()); break;
        case 1: t.erase(pos, 1 + g() % 12); break;
        case 2: t.insert(pos, 1, static_cast<char>(g())); break;
        case 3: t.resize(pos); break;
        default: t.insert(pos, kTokens[g() % (sizeof kTokens / sizeof *kTokens)]);
      }
      if (t.empty()) t = " ";
    }
    try {
      const Graph parsed = parse_graph(t, "m.ir");
      verify(parsed);
      const std::string printed = print_graph(parsed);
      EXPECT_EQ(print_graph(parse_graph(printed, "printed.ir")), printed) << "mutation " << i;
      ++accepted;
    } catch (const CompileError& e) {
      ++rejected;
      // The parser names the file; the verifier names the graph or its node.
      EXPECT_FALSE(std::string(e.what()).empty());
    } catch (const std::exception& e) {
      ADD_FAILURE() << "mutation " << i << " threw " << e.what() << "\n--- text ---\n" << t;
    }
  }
  // Mutations in names and float bits keep some graphs valid; most break one.
  EXPECT_GT(accepted, 0);
  EXPECT_GT(rejected, 0);
  std::printf("%d accepted, %d rejected\n", accepted, rejected);
}

TEST(GraphIr, FloatsAndNamesSurviveRoundTrip) {
  Graph g;
  g.name = "odd name/with:chars";
  g.inputs.push_back({"in put\"q\\", {DType::kF32, {3}}});
  Node n;
  n.id = 41;
  n.op = OpKind::kClip;
  n.inputs = {"in put\"q\\"};
  n.output = "onnx::Clip_7";
  n.type = {DType::kF32, {3}};
  const float vals[] = {1e-12f, 0.1f, 16777217.0f, -0.0f, 3.4028235e38f, 1.17549435e-38f, 7.0f};
  for (float v : vals) {
    n.attrs["min"] = Attr::Float(v);
    n.attrs["max"] = Attr::Float(-INFINITY);
    g.nodes = {n};
    g.outputs = {n.output};
    const Graph back = parse_graph(print_graph(g));
    ASSERT_EQ(back.nodes.size(), 1u);
    const float got = back.nodes[0].attr_float("min");
    EXPECT_EQ(std::memcmp(&got, &v, 4), 0) << v;
    EXPECT_EQ(back.nodes[0].attr_float("max"), -INFINITY);
    EXPECT_EQ(back.name, g.name);
    EXPECT_EQ(back.inputs[0].name, g.inputs[0].name);
    EXPECT_EQ(print_graph(back), print_graph(g));
  }
}

TensorType infer(const std::string& node_line, const std::string& inputs) {
  const std::string text = "graph t {\n" + inputs + "  " + node_line + "\n  output %y\n}\n";
  Graph g = parse_graph(text);
  std::vector<TensorType> in;
  const auto types = g.types();
  for (const auto& s : g.nodes[0].inputs) in.push_back(types.at(s));
  return infer_type(g.nodes[0], in);
}

TEST(GraphIr, ShapeInference) {
  const std::string x = "  input %x : f32[1,3,224,224]\n  input %w : f32[64,3,7,7]\n";
  // torchvision resnet stem: 224 -> 112 with 7x7 stride 2 pad 3.
  EXPECT_EQ(type_str(infer("%y = conv2d(%x, %w) {dilations=[1,1], groups=1, pads=[3,3,3,3], strides=[2,2]} : f32[1] #0", x)), "f32[1,64,112,112]");
  // (17 + 1 + 0 - 2*(3-1) - 1) / 2 + 1 = 7 rows, (19 + 2 + 1 - 5) / 3 + 1 = 6 columns.
  EXPECT_EQ(type_str(infer("%y = conv2d(%x, %w) {dilations=[2,2], groups=2, pads=[1,2,0,1], strides=[2,3]} : f32[1] #0",
                           "  input %x : f32[2,4,17,19]\n  input %w : f32[6,2,3,3]\n")),
            "f32[2,6,7,6]");
  EXPECT_EQ(type_str(infer("%y = matmul(%a, %b) : f32[1] #0", "  input %a : f32[3,1,5,130]\n  input %b : f32[4,130,7]\n")), "f32[3,4,5,7]");
  EXPECT_EQ(type_str(infer("%y = matmul(%a, %b, %c) {trans_a=1, trans_b=1} : f32[1] #0",
                           "  input %a : f32[40,33]\n  input %b : f32[20,40]\n  input %c : f32[20]\n")),
            "f32[33,20]");
  EXPECT_EQ(type_str(infer("%y = add(%a, %b) : f32[1] #0", "  input %a : f32[129,1,200]\n  input %b : f32[7,1]\n")), "f32[129,7,200]");
  EXPECT_EQ(type_str(infer("%y = maxpool(%x) {kernel=[3,3], pads=[1,1,1,1], strides=[2,2]} : f32[1] #0", "  input %x : f32[1,64,112,112]\n")),
            "f32[1,64,56,56]");
  EXPECT_EQ(type_str(infer("%y = slice(%x) {ends=[126,150], starts=[1,5], steps=[2,3]} : f32[1] #0", "  input %x : f32[129,200]\n")),
            "f32[63,49]");
  EXPECT_EQ(type_str(infer("%y = gather(%t, %i) {axis=1} : f32[1] #0", "  input %t : f32[4,50,3]\n  input %i : i64[2,7]\n")), "f32[4,2,7,3]");
  EXPECT_EQ(type_str(infer("%y = flatten(%x) {axis=2} : f32[1] #0", "  input %x : f32[2,3,4,5]\n")), "f32[6,20]");
  EXPECT_EQ(type_str(infer("%y = reduce_mean(%x) {axes=[1,2], keepdims=0} : f32[1] #0", "  input %x : f32[2,3,4,5]\n")), "f32[2,5]");
  EXPECT_EQ(type_str(infer("%y = pad(%x) {pads=[1,0,2,3], value=0.0} : f32[1] #0", "  input %x : bf16[2,3]\n")), "bf16[5,6]");
  EXPECT_EQ(type_str(infer("%y = cast(%x) {to=\"bf16\"} : f32[1] #0", "  input %x : f32[2,3]\n")), "bf16[2,3]");
}

void expect_verify_error(const std::string& body, const std::string& needle) {
  const std::string text = "graph bad {\n" + body + "}\n";
  try {
    const Graph g = parse_graph(text, "bad.ir");
    verify(g, "bad.ir");
    FAIL() << "accepted:\n" << text;
  } catch (const CompileError& e) {
    const std::string msg = e.what();
    EXPECT_NE(msg.find(needle), std::string::npos) << "message: " << msg;
    EXPECT_EQ(msg.find('\n'), std::string::npos) << "multi-line message: " << msg;
  }
}

TEST(GraphIr, VerifierRejects) {
  const std::string in = "  input %a : f32[4,8]\n  input %b : f32[8,3]\n";
  expect_verify_error(in + "  %y = matmul(%a, %c) : f32[4,3] #0\n  output %y\n", "operand %c is not defined before use");
  // A cycle in text form is a use before definition.
  expect_verify_error(in + "  %y = relu(%z) : f32[4,8] #0\n  %z = relu(%y) : f32[4,8] #1\n  output %z\n", "%z is not defined before use");
  expect_verify_error(in + "  %y = matmul(%a, %b) : f32[4,4] #0\n  output %y\n", "declared type f32[4,4] but operands give f32[4,3]");
  expect_verify_error(in + "  %y = matmul(%b, %a) : f32[8,8] #0\n  output %y\n", "reduction lengths differ");
  expect_verify_error(in + "  %y = relu(%a) : f32[4,8] #0\n  %y = relu(%a) : f32[4,8] #1\n  output %y\n", "defined twice");
  expect_verify_error(in + "  %y = relu(%a) : f32[4,8] #3\n  %z = relu(%y) : f32[4,8] #3\n  output %z\n", "not unique");
  expect_verify_error(in + "  %y = relu(%a, %b) : f32[4,8] #0\n  output %y\n", "takes 1 operands, has 2");
  expect_verify_error(in + "  %y = relu(%a) : f32[4,8] #0\n  output %q\n", "output %q is not defined");
  expect_verify_error(in + "  %y = relu(%a) : f32[4,8] #0\n", "no outputs");
  expect_verify_error(in + "  %y = reduce_sum(%a) {axes=[0,2], keepdims=1} : f32[1,8] #0\n  output %y\n", "out of range");
  expect_verify_error("  input %a : f32[4,8,2]\n  %y = reduce_sum(%a) {axes=[0,2], keepdims=1} : f32[1,8,1] #0\n  output %y\n", "contiguous");
  expect_verify_error(in + "  %y = add(%a, %b) : f32[4,8] #0\n  output %y\n", "do not broadcast");
  expect_verify_error(in + "  %y = pow(%a) {exponent=1.5} : f32[4,8] #0\n  output %y\n", "exponent must be");
  expect_verify_error(in + "  %y = transpose(%a) {perm=[0,0]} : f32[4,8] #0\n  output %y\n", "not a permutation");
  expect_verify_error(in + "  %y = reshape(%a) {shape=[5,6]} : f32[5,6] #0\n  output %y\n", "cannot reshape");
  expect_verify_error(in + "  %y = conv2d(%a, %b) {dilations=[1,1], groups=1, pads=[0,0,0,0], strides=[1,1]} : f32[1] #0\n  output %y\n", "rank 4");
  expect_verify_error("  input %x : f32[1,4,5,5]\n  input %w : f32[6,2,3,3]\n  %y = conv2d(%x, %w) {dilations=[1,1], groups=3, pads=[0,0,0,0], strides=[1,1]} : f32[1,6,3,3] #0\n  output %y\n",
                      "groups=3 must divide");
  expect_verify_error("  input %x : f32[1,4,2,2]\n  %y = maxpool(%x) {kernel=[5,5], pads=[0,0,0,0], strides=[1,1]} : f32[1,4,1,1] #0\n  output %y\n",
                      "larger than the padded input");
  // A dilation of 2^63 - 1 (found by fuzzing) wrapped dil * (k - 1) to a small output
  // that the lowering then addressed outside VMEM; pads past 2^31 likewise.
  expect_verify_error("  input %x : f32[1,3,8,8]\n  input %w : f32[8,3,3,3]\n  %y = conv2d(%x, %w) {dilations=[1,9223372036854775807], "
                      "groups=1, pads=[1,1,1,1], strides=[1,1]} : f32[1,8,8,12] #0\n  output %y\n",
                      "must be below 2^31");
  expect_verify_error("  input %x : f32[1,3,8,8]\n  %y = maxpool(%x) {kernel=[2,2], pads=[0,0,0,2147483648], strides=[2,2]} "
                      ": f32[1,3,4,4] #0\n  output %y\n",
                      "must be below 2^31");
  // So did a reshape whose element count wraps to the input's ((2^62 + 8) x 4 = 2^64 +
  // 32, 32 mod 2^64, the 32 elements of [4,8]) and pads of 2^63 - 1.
  expect_verify_error(in + "  %y = reshape(%a) {shape=[4611686018427387912,4]} : f32[4,8] #0\n  output %y\n",
                      "cannot reshape");
  expect_verify_error(in + "  %y = pad(%a) {pads=[0,0,9223372036854775807,0], value=0.0} : f32[4,8] #0\n  output %y\n",
                      "pads must be below 2^40");
  // im2col's row count is N x OH x OW: (2^32 + 1)^2 rows from a 1x1 image padded by
  // 2^31 - 1 on every side.
  expect_verify_error("  input %x : f32[1,1,1,1]\n  %y = im2col(%x) {dilations=[1,1], kernel=[1,1], pads=[2147483647,"
                      "2147483647,2147483647,2147483647], strides=[1,1]} : f32[1,1] #0\n  output %y\n",
                      "patches of more than 2^40 elements");
  expect_verify_error("  input %x : f32[4]\n  input %i : f32[2]\n  %y = gather(%x, %i) {axis=0} : f32[2] #0\n  output %y\n", "indices must be i64");
  expect_verify_error("  input %x : f32[4]\n  input %z : bf16[4]\n  %y = add(%x, %z) : f32[4] #0\n  output %y\n", "mix");
  expect_verify_error("  input %x : f32[4]\n  %y = relu(%x) : f32[4] #0 fusion=#9\n  output %y\n", "fused into #9");
  expect_verify_error("  input %x : f32[4,4]\n  %y = matmul(%x, %x) {alpha=\"a\"} : f32[4,4] #0\n  output %y\n", "must be a float");
}

void expect_parse_error(const std::string& text, const std::string& needle) {
  try {
    parse_graph(text, "p.ir");
    FAIL() << "parsed:\n" << text;
  } catch (const CompileError& e) {
    EXPECT_NE(std::string(e.what()).find(needle), std::string::npos) << e.what();
  }
}

TEST(GraphIr, ParserErrorsNameLineAndColumn) {
  expect_parse_error("graph g {\n  input %x : f32[2]\n  %y = frobnicate(%x) : f32[2] #0\n}\n", "p.ir:3:8: unknown op 'frobnicate'");
  expect_parse_error("graph g {\n  input %x : f33[2]\n}\n", "p.ir:2:17: unknown element type 'f33'");
  expect_parse_error("graph g {\n  input %x : f32[2]\n", "missing '}'");
  expect_parse_error("graph g {\n  const %c : f32[2] = [0x3f800000]\n}\n", "needs 2 values, has 1");
  expect_parse_error("graph g {\n  const %c : f32[1] = [1.0]\n}\n", "0x followed by 8 hex digits");
  expect_parse_error("graph g {\n  input %x : f32[0]\n}\n", "dimensions must be >= 1");
  expect_parse_error("graph g {\n  input %x : f32[2]\n  %y = relu(%x) : f32[2]\n}\n", "expected '#'");
  expect_parse_error("graph g {\n  input %x : f32[2]\n  %y = relu(%x) {a=1, a=2} : f32[2] #0\n}\n", "given twice");
  expect_parse_error("graph g {\n  input %\"x : f32[2]\n}\n", "unterminated string");
  expect_parse_error("graph g {\n}\n trailing", "text after the end");
  expect_parse_error("graph g {\n  input %x : f32[100000000,100000000,1000]\n}\n", "has more than 2^40 elements");
  expect_parse_error("", "p.ir:1:1: unexpected end of text");
  // A control byte is shown as \xNN, so the error stays one readable line.
  expect_parse_error("graph g {\n  input %x : f32[2\x1e]\n}\n", "p.ir:2:19: expected ']', found '\\x1e'");
  expect_parse_error("graph g {\n  input\x1b %x : f32[2]\n}\n", "p.ir:2:8: expected '%', found '\\x1b'");
}

}  // namespace
}  // namespace tpusim::compiler
