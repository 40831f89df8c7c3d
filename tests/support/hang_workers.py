"""Worker programs for the hang tests (test_finish_timeout.py, test_etcd_hangs.py), written to a
file by the test and run under ddprun with torch 1.13."""

# Seed 001 on CPU: rank argv[1] has less data and leaves (exit 0) in the first argv[2] attempts (all
# when absent); the other ranks wait on the job's TCPStore for a key the leaving rank never sets,
# in a function named for the test to find in the stack dump. The store is the agent's where the
# launcher says so (TORCHELASTIC_USE_AGENT_STORE=True, as torch's env:// reads it), else rank 0's.
UNEVEN = r'''
import datetime, os, sys
import torch.distributed as dist

def wait_for_peer_that_left(store):
    store.wait(["rank1_batch_100"], datetime.timedelta(seconds=600))

rank = int(os.environ["RANK"])
hosts = rank == 0 and os.environ.get("TORCHELASTIC_USE_AGENT_STORE") != "True"
store = dist.TCPStore(os.environ["MASTER_ADDR"], int(os.environ["MASTER_PORT"]),
                      int(os.environ["WORLD_SIZE"]), hosts, datetime.timedelta(seconds=60))
store.set("rank%d_ready" % rank, "1")
store.wait(["rank0_ready", "rank1_ready"])
uneven = int(os.environ["TORCHELASTIC_RESTART_COUNT"]) < (int(sys.argv[2]) if len(sys.argv) > 2 else 99)
if rank == int(sys.argv[1]) and uneven:
    print("out of data: leaving", flush=True)
    sys.exit(0)
if uneven:
    wait_for_peer_that_left(store)
'''
