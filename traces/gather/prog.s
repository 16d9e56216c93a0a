# Strided DMA gather and a 128x128 transpose.
#   g[16,128] = x[0:32:2, 64:192]           (2-D strided DMA, HBM -> VMEM -> HBM)
#   h[2,4,32] = x[0:16:8, 0:4, 0:32] laid out densely (3-D strided DMA, HBM -> HBM)
#   zt = z^T for z[128,128]                 (16 vld, vxpose, 16 vst)
# The row count of z is read from SMEM (written there by a DMA) to drive the loops.
.target chips=1 cores=1
.input  x f32 [32, 256] hbm:0x0
.input  z f32 [128, 128] hbm:0x10000
.const  nrows i32 [1] hbm:0x30000 data=[128]
.output g f32 [16, 128] hbm:0x40000
.output h f32 [2, 4, 32] hbm:0x50000
.output zt f32 [128, 128] hbm:0x60000
.flag f 1

.core 0
  op 11
  dma vmem:[s0 + 0], hbm:[s0 + 256], bytes=512, dim=16:2048:512, flag=f
  dma hbm:[s0 + 0x50000], hbm:[s0 + 0], bytes=128, dim=4:1024:128, dim=2:8192:512, flag=f
  dma smem:[s0 + 16], hbm:[s0 + 0x30000], bytes=4, flag=f
  wait.sub f, 3
  dma hbm:[s0 + 0x40000], vmem:[s0 + 0], bytes=8192, flag=f
  op 12
  ld s1, [s0 + 16]              # 128 rows
  shr s2, s1, 3                 # 16 tiles of 8 rows
  st s2, [s0 + 20]
  dma vmem:[s0 + 0x10000], hbm:[s0 + 0x10000], bytes=65536, flag=f
  wait.sub f, 2
  li s3, 0x10000
  # Register numbers are not indirect, so the 16 loads are unrolled.
  vld v16, [s3 + 0]
  vld v17, [s3 + 4096]
  vld v18, [s3 + 8192]
  vld v19, [s3 + 12288]
  vld v20, [s3 + 16384]
  vld v21, [s3 + 20480]
  vld v22, [s3 + 24576]
  vld v23, [s3 + 28672]
  vld v24, [s3 + 32768]
  vld v25, [s3 + 36864]
  vld v26, [s3 + 40960]
  vld v27, [s3 + 45056]
  vld v28, [s3 + 49152]
  vld v29, [s3 + 53248]
  vld v30, [s3 + 57344]
  vld v31, [s3 + 61440]
  vxpose v0, v16
  li s5, 0x20000
  vst v0, [s5 + 0]
  vst v1, [s5 + 4096]
  vst v2, [s5 + 8192]
  vst v3, [s5 + 12288]
  vst v4, [s5 + 16384]
  vst v5, [s5 + 20480]
  vst v6, [s5 + 24576]
  vst v7, [s5 + 28672]
  vst v8, [s5 + 32768]
  vst v9, [s5 + 36864]
  vst v10, [s5 + 40960]
  vst v11, [s5 + 45056]
  vst v12, [s5 + 49152]
  vst v13, [s5 + 53248]
  vst v14, [s5 + 57344]
  vst v15, [s5 + 61440]
  ld s6, [s0 + 20]              # 16 tiles of 4 KiB, written back one DMA each
  li s9, 0
store:
  dma hbm:[s9 + 0x60000], vmem:[s9 + 0x20000], bytes=4096, flag=f
  add s9, s9, 4096
  loop s6, store
  wait.sub f, 16
  halt
