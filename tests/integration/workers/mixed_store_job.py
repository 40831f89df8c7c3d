"""One job, two kinds of ranks on one store (test_torch_store.py): odd ranks are libddp's C++
store_exchange, even ranks do the same with torch's own TCPStore client at MASTER_ADDR:MASTER_PORT
(no PrefixStore). torch's client sends its key K as "/K", so the C++ ranks use "/" before theirs
(STORE_EXCHANGE_KEY_PREFIX). Every rank adds 1 to "arrived", sets "rank/<R>", waits for every
rank's key and races a compare_set for "leader", then prints "rank R: arrived=A leader=L"."""
import datetime
import os
import sys

rank, world = int(os.environ["RANK"]), int(os.environ["WORLD_SIZE"])
if rank % 2 == 1:
    exe = os.path.join(os.environ["DDPRUN_TEST_BIN"], "store_exchange")
    os.environ["STORE_EXCHANGE_KEY_PREFIX"] = "/"
    os.execv(exe, [exe])

import torch.distributed as dist  # noqa: E402

store = dist.TCPStore(os.environ["MASTER_ADDR"], int(os.environ["MASTER_PORT"]), is_master=False,
                      timeout=datetime.timedelta(seconds=60))
store.add("arrived", 1)
store.set("rank/%d" % rank, str(rank))
store.wait(["rank/%d" % r for r in range(world)])
leader = store.compare_set("leader", "", str(rank)).decode()
print("rank %d: arrived=%d leader=%s" % (rank, store.add("arrived", 0), leader), flush=True)
