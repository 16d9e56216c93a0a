// Convolution on the MXU (shared/spec/numerics.md, "Convolution"): a matmul whose
// reduction index runs over (kh, kw, cin) with cin fastest,
//   k = (kh * KW + kw) * Cin_g + cin,      Cin_g = Cin / groups,
// cut into chunks of R exactly as mxu_matmul_reference does. Spatial padding
// supplies +0.0 activations whose products are formed like any other (so a padded
// tap contributes +0.0 * w, keeping w's sign for a zero result).
//
// Layouts: activations NHWC (bf16), weights HWIO (bf16, [KH][KW][Cin_g][Cout]),
// output NHWC (fp32). With groups > 1, group g reads input channels
// [g*Cin_g, (g+1)*Cin_g) and writes output channels [g*Cout_g, (g+1)*Cout_g) using
// the HWIO columns of those output channels.
#pragma once

#include <cstdint>

#include "isa/numerics/mxu.h"

namespace tpusim::num {

struct Conv2dShape {
  int n = 1, h = 1, w = 1, cin = 1;  // input NHWC
  int kh = 1, kw = 1, cout = 1;      // filter HWIO (I = cin / groups)
  int stride_h = 1, stride_w = 1;
  int pad_top = 0, pad_left = 0, pad_bottom = 0, pad_right = 0;
  int dilation_h = 1, dilation_w = 1;
  int groups = 1;
};

// Output height/width: floor((in + pads - dilation*(k-1) - 1) / stride) + 1.
int conv2d_out_h(const Conv2dShape& s);
int conv2d_out_w(const Conv2dShape& s);

// Length of the reduction (KH * KW * Cin_g) and the im2col index of one tap.
inline int conv2d_reduction_length(const Conv2dShape& s) { return s.kh * s.kw * (s.cin / s.groups); }
inline int conv2d_reduction_index(const Conv2dShape& s, int kh, int kw, int cin_in_group) {
  return (kh * s.kw + kw) * (s.cin / s.groups) + cin_in_group;
}

// Throws std::invalid_argument with a one-line message naming the bad field.
void conv2d_validate(const Conv2dShape& s);

struct Conv2dArgs {
  Conv2dShape shape;
  const uint16_t* x = nullptr;  // N x H x W x Cin bf16
  const uint16_t* w = nullptr;  // KH x KW x Cin_g x Cout bf16
  float* y = nullptr;           // N x OH x OW x Cout fp32
  const float* bias = nullptr;  // optional, Cout values: y = acc + bias[o], one fp32 add
  int rows = 128;               // R
  bool accumulate = false;      // acc = y + s_0, as mxu_matmul_reference
};

// The contract: im2col (padding taps = bf16 +0.0) and mxu_matmul_reference per
// group, then the bias add.
void conv2d_reference(const Conv2dArgs& args);

// The same through the fast kernel (mxu_matmul); bit-identical to conv2d_reference.
void conv2d(const Conv2dArgs& args);

}  // namespace tpusim::num
