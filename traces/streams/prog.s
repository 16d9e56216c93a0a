# Two instruction streams of one core (docs/isa.md, "Streams"). Stream 0 forks
# stream 1; each loads and squares its own tile, so one stream's work issues while
# the other waits for its load. Stream 1 reports on `join`, after which stream 0
# reads stream 1's square from VMEM: y0 = x0 * x0, y1 = x1 * x1 + x0.
.target chips=1 cores=1
.input  x0 f32 [8, 128] hbm:0x0
.input  x1 f32 [8, 128] hbm:0x1000
.output y0 f32 [8, 128] hbm:0x2000
.output y1 f32 [8, 128] hbm:0x3000
.region a0 vmem 0x0000 4096
.region a1 vmem 0x1000 4096
.region sq1 vmem 0x2000 4096
.region o0 vmem 0x3000 4096
.region o1 vmem 0x4000 4096
.flag load0 1
.flag store0 2
.flag load1 3
.flag join 9

.core chip0.core0
  op 1
  fork second
  dma vmem:[s0 + a0], hbm:[s0 + 0x0], bytes=4096, flag=load0
  wait load0, 1
  vld v0, [s0 + a0]
  vmul v1, v0, v0
  vst v1, [s0 + o0]
  dma hbm:[s0 + 0x2000], vmem:[s0 + o0], bytes=4096, flag=store0
  wait join, 1                  # stream 1's square of x1 is in sq1
  vld v2, [s0 + sq1]
  vadd v3, v2, v0
  vst v3, [s0 + o1]
  dma hbm:[s0 + 0x3000], vmem:[s0 + o1], bytes=4096, flag=store0
  wait store0, 2
  halt
second:
  dma vmem:[s0 + a1], hbm:[s0 + 0x1000], bytes=4096, flag=load1
  wait load1, 1
  vld v8, [s0 + a1]
  vmul v9, v8, v8
  vst v9, [s0 + sq1]
  fadd join, 1
  halt
