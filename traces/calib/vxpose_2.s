# 128x128 f32 transpose: 2 back to back (v4: 259 cycles each)
.target chips=1 cores=1 mxus=1
.core chip0.core0
  vxpose v16, v0
  vxpose v16, v0
  halt
