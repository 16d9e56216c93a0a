# LayerNorm over the last axis of x[8,128]:
#   mean = sum(x) * (1/128); d = x - mean; var = sum(d*d) * (1/128)
#   y = ((d * rsqrt(var + 1e-5)) * gamma) + beta
# gamma/beta (constants from .npy files) are replicated to all 8 sublanes by a DMA
# whose source stride is 0.
.target chips=1 cores=1
.input  x f32 [8, 128] hbm:0x0
.const  gamma f32 [128] hbm:0x1000 file="gamma.npy"
.const  beta f32 [128] hbm:0x1200 file="beta.npy"
.output y f32 [8, 128] hbm:0x2000
.region xv vmem 0x0 4096
.region gv vmem 0x1000 4096
.region bv vmem 0x2000 4096
.region yv vmem 0x3000 4096
.flag loaded 3
.flag stored 4

.core 0
  op 3
  dma vmem:[s0 + xv], hbm:[s0 + 0], bytes=4096, flag=loaded
  dma vmem:[s0 + gv], hbm:[s0 + 0x1000], bytes=512, dim=8:0:512, flag=loaded
  dma vmem:[s0 + bv], hbm:[s0 + 0x1200], bytes=512, dim=8:0:512, flag=loaded
  wait.sub loaded, 3
  vld v0, [s0 + xv]
  vbcast v10, 0.0078125
  vreduce.lanes.sum v1, v0
  vmul v2, v1, v10              # mean
  vsub v3, v0, v2               # d
  vmul v4, v3, v3
  vreduce.lanes.sum v5, v4
  vmul v6, v5, v10              # var
  vbcast v11, 1e-5
  vadd v7, v6, v11
  vrsqrt v8, v7
  vmul v9, v3, v8
  vld v12, [s0 + gv]
  vld v13, [s0 + bv]
  vmul v9, v9, v12
  vadd v9, v9, v13
  vst v9, [s0 + yv]
  dma hbm:[s0 + 0x2000], vmem:[s0 + yv], bytes=4096, flag=stored
  wait.sub stored, 1
  halt
