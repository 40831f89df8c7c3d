"""The multi-node bench (bench/multinode_bench.py, its command line and report), one module per
case:

  rdzv.py     rendezvous at scale, against the floors of starting N processes
  failure.py  a node's loss, to the survivors' next round
  store.py    store operations per second and a job's store bootstrap, against TCPStore

and what they share: driver.py (the Bench that every case runs in: temporary folders, command
lines, the spawn loop, the workers' stamps, the report), procs.py (every process the driver
starts, killed again), common.py (/proc readers, waiting, formatting)."""
