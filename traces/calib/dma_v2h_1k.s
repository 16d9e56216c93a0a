# DMA VMEM->HBM, 1 KiB, one in flight (v4: 417.5 + 1.051 K cycles)
.target chips=1 cores=1 mxus=1
.core chip0.core0
  dma hbm:[s0 + 0], vmem:[s0 + 0], bytes=1024, flag=f1
  wait.sub f1, 1
  halt
