# transcendental issue rate: 32 independent vexp (v4: one per 2 cycles)
.target chips=1 cores=1 mxus=1
.core chip0.core0
  vexp v1, v0
  vexp v2, v0
  vexp v3, v0
  vexp v4, v0
  vexp v5, v0
  vexp v6, v0
  vexp v7, v0
  vexp v8, v0
  vexp v9, v0
  vexp v10, v0
  vexp v11, v0
  vexp v12, v0
  vexp v13, v0
  vexp v14, v0
  vexp v15, v0
  vexp v16, v0
  vexp v17, v0
  vexp v18, v0
  vexp v19, v0
  vexp v20, v0
  vexp v21, v0
  vexp v22, v0
  vexp v23, v0
  vexp v24, v0
  vexp v25, v0
  vexp v26, v0
  vexp v27, v0
  vexp v28, v0
  vexp v29, v0
  vexp v30, v0
  vexp v1, v0
  vexp v2, v0
  halt
