# Softmax of one 128-element row: y = exp(x - max(x)) / sum(exp(x - max(x))).
# The row sits in sublane 0; the other sublanes are masked off on load and store.
.target chips=1 cores=1
.input  x f32 [1, 128] hbm:0x0
.output y f32 [1, 128] hbm:0x1000
.flag io 0

.core 0
  op 7
  dma vmem:[s0 + 0x100], hbm:[s0 + 0], bytes=512, flag=io
  wait.sub io, 1
  vmask m1, 1, 128
  vld v0, [s0 + 0x100], mask=m1
  vreduce.lanes.max v1, v0
  vsub v2, v0, v1
  vexp v3, v2
  vreduce.lanes.sum v4, v3
  vdiv v5, v3, v4
  vst v5, [s0 + 0x800], mask=m1
  dma hbm:[s0 + 0x1000], vmem:[s0 + 0x800], bytes=512, flag=io
  wait.sub io, 1
  halt
