# Host infeed and outfeed: the input arrives in host memory, is fed over PCIe into
# VMEM, transformed on the vector unit, and fed back out to host memory.
#   t = tanh(x); e = erf(x); r = sqrt(|x|); l = log(|x| + 1); q = recip(x)
#   y = x > 0 ? t : e          (compare + select)
#   n = int(round(x * 100))    (fp32 -> int32) and back: k = float(n) / 100
#   c = bf16 round of x (vcvt.bf16), scaled by a scalar-register broadcast of 3
#   z = column max over sublanes, column min, -x
# The scalar constant is computed on the scalar unit (div/rem/xor/min/max/sra...).
.target chips=1 cores=1
.input  x f32 [8, 128] host:0x0
.output y f32 [8, 128] host:0x10000
.output r f32 [8, 128] host:0x11000
.output l f32 [8, 128] host:0x12000
.output q f32 [8, 128] host:0x13000
.output n i32 [8, 128] host:0x14000
.output k f32 [8, 128] host:0x15000
.output c bf16 [8, 128] host:0x16000
.output cmax f32 [8, 128] host:0x17000
.output cmin f32 [8, 128] host:0x18000
.output neg f32 [8, 128] host:0x19000
.flag in 0
.flag out 1

.core 0
  op 31
  dma vmem:[s0 + 0], host:[s0 + 0], bytes=4096, flag=in
  wait.sub in, 1
  # scalar unit: s9 = 3 through a detour of integer operations
  li s1, 100
  li s2, 7
  div s3, s1, s2                # 14
  rem s4, s1, s2                # 2
  mul s5, s3, s4                # 28
  sub s5, s5, 25                # 3
  xor s6, s5, 0xF0              # 0xF3
  and s6, s6, 0x0F              # 3
  li s7, -48
  sra s7, s7, 4                 # -3
  max s8, s6, s7                # 3
  min s8, s8, 100
  or s8, s8, 0
  shl s8, s8, 2
  shr s8, s8, 2                 # 3
  st s8, [s0 + 0]
  ld s9, [s0 + 0]
  vbcast v31, s9                # int32 3 in every lane
  vcvt.f32.s32 v30, v31         # 3.0
  vld v0, [s0 + 0]
  vtanh v1, v0
  verf v2, v0
  vbcast v3, 0.0
  vcmp.gt m2, v0, v3
  vsel v4, m2, v1, v2
  vst v4, [s0 + 0x1000]
  vabs v5, v0
  vsqrt v6, v5
  vst v6, [s0 + 0x2000]
  vbcast v7, 1.0
  vadd v8, v5, v7
  vlog v9, v8
  vst v9, [s0 + 0x3000]
  vrecip v10, v0
  vst v10, [s0 + 0x4000]
  vbcast v11, 100.0
  vmul v12, v0, v11
  vcvt.s32.f32 v13, v12
  vst v13, [s0 + 0x5000]
  vcvt.f32.s32 v14, v13
  vdiv v15, v14, v11
  vst v15, [s0 + 0x6000]
  vcvt.bf16 v16, v0
  vmul v16, v16, v30
  vst.bf16 v16, [s0 + 0x7000]
  vreduce.sublanes.max v17, v0
  vst v17, [s0 + 0x8000]
  vreduce.sublanes.min v18, v0
  vst v18, [s0 + 0x9000]
  vneg v19, v0
  vst v19, [s0 + 0xA000]
  dma host:[s0 + 0x10000], vmem:[s0 + 0x1000], bytes=4096, dim=10:4096:4096, flag=out
  wait out, 1
  halt
