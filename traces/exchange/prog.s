# Two cores exchange tiles through remote DMA and sync flags.
# Core c loads x_c, squares it, and writes the square into the OTHER core's VMEM
# (rflag raises the receiver's flag once the data has landed). Each core then
# computes y_c = x_c + (x0*x0 + x1*x1), and both wait at a barrier before halting.
.target chips=1 cores=2
.input  x0 f32 [8, 128] hbm:0x0
.input  x1 f32 [8, 128] hbm:0x1000
.output y0 f32 [8, 128] hbm:0x2000
.output y1 f32 [8, 128] hbm:0x3000
.region own  vmem 0x0000 4096
.region sq   vmem 0x1000 4096
.region recv vmem 0x2000 4096
.region out  vmem 0x3000 4096
.flag local 1
.flag received 5
.flag sent 6

.core chip0.core0
  op 21
  dma vmem:[s0 + own], hbm:[s0 + 0x0], bytes=4096, flag=local
  wait.sub local, 1
  vld v0, [s0 + own]
  vmul v1, v0, v0
  vst v1, [s0 + sq]
  dma vmem@c1:[s0 + recv], vmem:[s0 + sq], bytes=4096, flag=sent, rflag=received
  wait.sub received, 1
  vld v2, [s0 + recv]
  vadd v3, v1, v2               # x0*x0 + x1*x1
  vadd v4, v0, v3
  vst v4, [s0 + out]
  dma hbm:[s0 + 0x2000], vmem:[s0 + out], bytes=4096, flag=local
  wait.sub sent, 1
  wait.sub local, 1
  barrier
  halt

.core chip0.core1
  op 21
  dma vmem:[s0 + own], hbm:[s0 + 0x1000], bytes=4096, flag=local
  wait.sub local, 1
  vld v0, [s0 + own]
  vmul v1, v0, v0
  vst v1, [s0 + sq]
  dma vmem@c0:[s0 + recv], vmem:[s0 + sq], bytes=4096, flag=sent, rflag=received
  wait.sub received, 1
  vld v2, [s0 + recv]
  vadd v3, v2, v1               # x0*x0 + x1*x1 (same order as core 0)
  vadd v4, v0, v3
  vst v4, [s0 + out]
  dma hbm:[s0 + 0x3000], vmem:[s0 + out], bytes=4096, flag=local
  wait.sub sent, 1
  wait.sub local, 1
  barrier
  halt
