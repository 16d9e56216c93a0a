# Golden-report program (tests/sim/report_golden_test.cpp): one 8 x 8 x 128 matmul
# with everything in VMEM, so its timing follows from the v3 preset's MXU and VPU
# figures alone (docs/mxu.md "Timing"); the derivation is in matmul_v3.md.
.target chips=1 cores=1 mxus=1 mxu_rows=128 mxu_cols=128 fifo_rows=256
.input  w bf16 [8, 128] vmem:0x0
.input  x f32  [8, 128] vmem:0x1000
.output y f32  [8, 128] vmem:0x2000

.core chip0.core0
# The VMEM plan: while op 7 runs, the three tensors above are live in VMEM.
.vmem op=7 addr=0x0 bytes=2048
.vmem op=7 addr=0x1000 bytes=4096
.vmem op=7 addr=0x2000 bytes=4096
  op 7
  vld.bf16 v0, [s0 + 0]
  vld v1, [s0 + 0x1000]
  mpush mxu0, v0
  mswap mxu0, k=8
  mmul mxu0, v1
  mpop v2, mxu0
  vst v2, [s0 + 0x2000]
  halt
