# cross-lane reduce latency: 2 dependent (v4: 79 cycles each)
.target chips=1 cores=1 mxus=1
.core chip0.core0
  vreduce.lanes.sum v1, v1
  vreduce.lanes.sum v1, v1
  halt
