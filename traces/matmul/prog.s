# Tiled matmul y[16,128] = a[16,512] @ w[512,128] on one 128x128 MXU.
# K = 512 > R = 128: four weight chunks, double-buffered in VMEM (chunk c+2 is
# fetched into a buffer as soon as chunk c has moved into the MXU), chunk sums
# combined in increasing order with mpop then mpop.add.
.target chips=1 cores=1 mxus=1 mxu_rows=128 mxu_cols=128 fifo_rows=32
.input  a f32  [16, 512] hbm:0x0
.input  w bf16 [512, 128] hbm:0x10000
.output y f32  [16, 128] hbm:0x40000

.equ A_ROW 2048                 # bytes per row of a
.equ W_CHUNK 32768              # bytes per 128-row chunk of w (bf16)
.region abuf  vmem 0x00000 0x8000
.region wbuf0 vmem 0x10000 0x8000
.region wbuf1 vmem 0x18000 0x8000
.region ybuf  vmem 0x20000 0x2000
.flag a_ready 1
.flag w0_ready 2
.flag w1_ready 3
.flag y_done 4

.core chip0.core0
  op 1
  dma vmem:[s0 + abuf], hbm:[s0 + 0], bytes=32768, flag=a_ready
  dma vmem:[s0 + wbuf0], hbm:[s0 + 0x10000], bytes=W_CHUNK, flag=w0_ready
  dma vmem:[s0 + wbuf1], hbm:[s0 + 0x10000 + W_CHUNK], bytes=W_CHUNK, flag=w1_ready
  wait.sub a_ready, 1
  li s10, 0                     # chunk index c
  li s20, 2                     # pairs of chunks left
  li s21, 4                     # number of chunks
pair:
  # ---- even chunk, buffer 0
  wait.sub w0_ready, 1
  li s2, wbuf0
  li s3, 16
push0:
  vld.bf16 v0, [s2 + 0]
  mpush mxu0, v0
  add s2, s2, 2048
  loop s3, push0
  mswap mxu0
  add s4, s10, 2                # prefetch chunk c+2 into buffer 0
  bge s4, s21, noprefetch0
  mul s6, s4, W_CHUNK
  dma vmem:[s0 + wbuf0], hbm:[s6 + 0x10000], bytes=W_CHUNK, flag=w0_ready
noprefetch0:
  mul s7, s10, 512              # byte offset of this k-chunk within a row of a
  vld v1, [s7 + abuf], stride=A_ROW
  vld v2, [s7 + abuf + 8 * A_ROW], stride=A_ROW
  mmul mxu0, v1
  mmul mxu0, v2
  bne s10, s0, accumulate0
  mpop v20, mxu0
  mpop v21, mxu0
  jmp next0
accumulate0:
  mpop.add v20, mxu0
  mpop.add v21, mxu0
next0:
  add s10, s10, 1
  # ---- odd chunk, buffer 1
  wait.sub w1_ready, 1
  li s2, wbuf1
  li s3, 16
push1:
  vld.bf16 v0, [s2 + 0]
  mpush mxu0, v0
  add s2, s2, 2048
  loop s3, push1
  mswap mxu0
  add s4, s10, 2
  bge s4, s21, noprefetch1
  mul s6, s4, W_CHUNK
  dma vmem:[s0 + wbuf1], hbm:[s6 + 0x10000], bytes=W_CHUNK, flag=w1_ready
noprefetch1:
  mul s7, s10, 512
  vld v1, [s7 + abuf], stride=A_ROW
  vld v2, [s7 + abuf + 8 * A_ROW], stride=A_ROW
  mmul mxu0, v1
  mmul mxu0, v2
  mpop.add v20, mxu0
  mpop.add v21, mxu0
  add s10, s10, 1
  loop s20, pair
  op 2
  vst v20, [s0 + ybuf]
  vst v21, [s0 + ybuf + 4096]
  dma hbm:[s0 + 0x40000], vmem:[s0 + ybuf], bytes=8192, flag=y_done
  wait y_done, 1
  halt
