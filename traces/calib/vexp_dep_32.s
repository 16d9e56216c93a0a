# transcendental latency: 32 dependent vexp (v4: 7 cycles each)
.target chips=1 cores=1 mxus=1
.core chip0.core0
  vexp v1, v1
  vexp v1, v1
  vexp v1, v1
  vexp v1, v1
  vexp v1, v1
  vexp v1, v1
  vexp v1, v1
  vexp v1, v1
  vexp v1, v1
  vexp v1, v1
  vexp v1, v1
  vexp v1, v1
  vexp v1, v1
  vexp v1, v1
  vexp v1, v1
  vexp v1, v1
  vexp v1, v1
  vexp v1, v1
  vexp v1, v1
  vexp v1, v1
  vexp v1, v1
  vexp v1, v1
  vexp v1, v1
  vexp v1, v1
  vexp v1, v1
  vexp v1, v1
  vexp v1, v1
  vexp v1, v1
  vexp v1, v1
  vexp v1, v1
  vexp v1, v1
  vexp v1, v1
  halt
