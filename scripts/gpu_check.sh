#!/usr/bin/env bash
# The real-GPU checks, run on a machine with an NVIDIA GPU from the folder scripts/gpu_bundle.sh
# made (it copies this script there):   bash .gpu/gpu_check.sh [OUTDIR]
# 1. the NCCL unit tests ([nccl]) against the real CUDA runtime and NCCL, one process each;
# 2. train --backend nccl under ddprun (one rank per GPU) and the same run on gloo: same digest;
# 3. two local ranks with one GPU visible and --backend nccl: a clear refusal, never a shared GPU;
# 4. PyTorch 2.x (the machine's own) under ddprun: the torch DDP example on gloo, and an NCCL
#    all_reduce on cuda through env://;
# 5. --numa_binding with the real driver's PCI addresses;
# 6. hangs on real NCCL (two ranks on one GPU as two NCCL hosts): the SDK's flight recorder names
#    the rank that stalled, and a torch job's stacks show where each rank waits.
# Prints one "gpu_check: <name>: PASS|FAIL|INFO ..." line per check and a closing count.
set -u
here="$(cd "$(dirname "$0")" && pwd)"
out="${1:-${OUT:-/tmp/gpu_check}}"
mkdir -p "$out"
pass=0; fail=0
result() {  # name status detail
  echo "gpu_check: $1: $2 $3"
  if [ "$2" = PASS ]; then pass=$((pass + 1)); elif [ "$2" = FAIL ]; then fail=$((fail + 1)); fi
}

nvidia-smi -L || true
pyexe="$(command -v python3)"
find_lib() {  # the directory holding $1: the Python wheels' copy first, then anywhere under /usr and /opt
  local p
  p="$("$pyexe" - "$1" <<'EOF' 2>/dev/null
import glob, os, site, sys
for d in site.getsitepackages():
    for f in glob.glob(os.path.join(d, "nvidia", "**", sys.argv[1]), recursive=True):
        print(os.path.dirname(f)); sys.exit(0)
EOF
)"
  [ -n "$p" ] || p="$(dirname "$(find /usr /opt -name "$1" 2>/dev/null | head -1)" 2>/dev/null)"
  echo "$p"
}
nccl_dir="$(find_lib libnccl.so.2)"
cudart_dir="$(find_lib libcudart.so.13)"
export LD_LIBRARY_PATH="$here/lib:$nccl_dir:$cudart_dir${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}"
echo "gpu_check: libnccl from $nccl_dir, libcudart from $cudart_dir"
for b in "$here"/bin/*; do
  if ldd "$b" | grep -q "not found"; then ldd "$b" | grep "not found" | sed "s|^|gpu_check: $(basename "$b") |"; fi
done
export PATH="$here/bin:$PATH" PYTHON_EXEC="$pyexe" NCCL_DEBUG="${NCCL_DEBUG:-WARN}"
cd "$out"

# 1. NCCL unit tests, one Catch2 case per process (a skipped case exits 77).
"$here/bin/ddprun_unit_tests" --list-test-names-only "[nccl]" | grep -v '^$' > nccl_cases.txt
while IFS= read -r name; do
  # Catch2 reads a comma in a test spec as "or": escape it, and count a case that ran nothing as failed.
  timeout 300 "$here/bin/ddprun_unit_tests" "${name//,/\\,}" > "case.log" 2>&1
  rc=$?
  [ $rc -eq 0 ] && grep -q "No test cases matched" case.log && rc=99
  safe="$(echo "$name" | tr -c 'A-Za-z0-9' '_' | cut -c1-60)"
  cp case.log "unit_$safe.log"
  case $rc in
    0) result "unit [$name]" PASS "" ;;
    77) result "unit [$name]" SKIP "$(grep -m1 -i skip case.log)" ;;
    *) result "unit [$name]" FAIL "exit $rc: $(tail -5 case.log | tr '\n' ' ')" ;;
  esac
done < nccl_cases.txt

# 2. train on one GPU: nccl and gloo give the same digest.
digest() { grep -oE 'digest [0-9a-f]{16}' "$1" | grep -v start | head -1; }
timeout 300 ddprun --standalone --nproc_per_node=1 train --epochs 5 --seed 3 --backend nccl > train_nccl.log 2>&1
rc_n=$?
timeout 300 ddprun --standalone --nproc_per_node=1 train --epochs 5 --seed 3 > train_gloo.log 2>&1
rc_g=$?
dn="$(digest train_nccl.log)"; dg="$(digest train_gloo.log)"
if [ $rc_n -eq 0 ] && [ $rc_g -eq 0 ] && [ -n "$dn" ] && [ "$dn" = "$dg" ]; then
  result "train nccl vs gloo, 1 rank" PASS "$dn"
else
  result "train nccl vs gloo, 1 rank" FAIL "exit nccl $rc_n gloo $rc_g; nccl '$dn' gloo '$dg'; $(tail -3 train_nccl.log | tr '\n' ' ')"
fi

# 3. two local ranks, one GPU visible: local rank 1 refuses with a clear error (never two ranks on
#    one GPU); the same check runs on simulated devices in tests/e2e/test_simgpu_train.py.
timeout 120 env CUDA_VISIBLE_DEVICES=0 ddprun --standalone --nproc_per_node=2 train --epochs 2 --seed 3 --backend nccl \
  > train_two_on_one.log 2>&1
rc=$?
if [ $rc -ne 0 ] && grep -q "LOCAL_RANK=1 of LOCAL_WORLD_SIZE=2 has no CUDA device of its own" train_two_on_one.log; then
  result "train nccl, 2 ranks with 1 GPU visible: clear refusal" PASS ""
else
  result "train nccl, 2 ranks with 1 GPU visible: clear refusal" FAIL \
    "exit $rc: $(grep -v '^\s*$' train_two_on_one.log | tail -4 | tr '\n' ' ' | cut -c1-600)"
fi

# 4. PyTorch 2.x under ddprun.
timeout 300 ddprun --standalone --nproc_per_node=2 "$here/examples/ddp_train.py" --out "$out/model.pt" --epochs 2 > torch_gloo.log 2>&1
rc=$?
if [ $rc -eq 0 ]; then result "torch $("$pyexe" -c 'import torch; print(torch.__version__)') ddp_train.py gloo x2" PASS ""; else
  result "torch ddp_train.py gloo x2" FAIL "exit $rc: $(tail -5 torch_gloo.log | tr '\n' ' ')"; fi
cat > nccl_allreduce.py <<'EOF'
import os, torch, torch.distributed as dist
dist.init_process_group("nccl")
r, w = dist.get_rank(), dist.get_world_size()
torch.cuda.set_device(int(os.environ["LOCAL_RANK"]))
t = torch.full((1 << 20,), float(r + 1), device="cuda")
dist.all_reduce(t)
assert t[0].item() == w * (w + 1) / 2, t[0].item()
print("nccl all_reduce ok rank", r, "world", w, "restart", os.environ["TORCHELASTIC_RESTART_COUNT"])
dist.destroy_process_group()
EOF
timeout 300 ddprun --standalone --nproc_per_node=1 nccl_allreduce.py > torch_nccl.log 2>&1
rc=$?
if [ $rc -eq 0 ] && grep -q "nccl all_reduce ok" torch_nccl.log; then result "torch nccl all_reduce x1" PASS ""; else
  result "torch nccl all_reduce x1" FAIL "exit $rc: $(tail -5 torch_nccl.log | tr '\n' ' ')"; fi

# 5. --numa_binding with the real driver's PCI addresses and this machine's sysfs: every mode gives
#    local rank 0 a non-empty CPU set (--dry_run prints it), and a worker really runs on it.
for mode in node socket exclusive core-complex; do
  line="$(ddprun --numa_binding=$mode --nproc_per_node=1 --dry_run /bin/true 2>&1 | grep -E '^  0 -> 0  cpus [0-9]')"
  if [ -n "$line" ]; then result "numa_binding=$mode" PASS "${line#  0 -> 0  }"; else
    result "numa_binding=$mode" FAIL "$(ddprun --numa_binding=$mode --nproc_per_node=1 --dry_run /bin/true 2>&1 | head -3 | tr '\n' ' ')"; fi
done
ddprun --numa_binding=node --nproc_per_node=1 --no_python /bin/sh -c 'grep Cpus_allowed_list /proc/self/status' > numa_run.log 2>&1
result "numa_binding=node, a worker's own affinity" INFO "$(tr '\n' ' ' < numa_run.log | cut -c1-200); machine: $(nproc) CPUs, nodes $(ls /sys/devices/system/node | grep -c node)"

# 6. Hangs on real NCCL. One GPU holds two ranks only as two NCCL "hosts" (NCCL_HOSTID per rank,
#    over sockets on loopback): NCCL refuses two ranks of one host on one device. A rank that
#    stalls before an all-reduce leaves its peer waiting inside NCCL for good; ddprun must name it.
export NCCL_SOCKET_IFNAME=lo NCCL_IB_DISABLE=1 NCCL_P2P_DISABLE=1 NCCL_SHM_DISABLE=1 NCCL_NVLS_ENABLE=0
export PYTHONPATH="$here/python${PYTHONPATH:+:$PYTHONPATH}"
as_host='NCCL_HOSTID=ddprun-check-$RANK exec "$0" "$@"'
train_args=(--backend nccl --device 0 --epochs 50 --samples 512 --timeout 600)
#  a. the C++ SDK: the flight recorder blames rank 1, which never started all_reduce #7.
timeout 120 ddprun --standalone --nproc_per_node=2 --hang_timeout=3 --no_python /bin/sh -c "$as_host" \
  "$here/bin/train" "${train_args[@]}" --stall_at_step 7 > hang_sdk_stall.log 2>&1
rc=$?
line="$(grep -m1 -oE 'flight recorder: rank 1 never started all_reduce #[0-9]+[^;]*; rank 0 waits in it' hang_sdk_stall.log)"
if [ $rc -eq 124 ] && [ -n "$line" ]; then result "hang, SDK on NCCL: rank 1 stalls before all_reduce" PASS "$line"; else
  result "hang, SDK on NCCL: rank 1 stalls before all_reduce" FAIL "exit $rc: $(grep -v '^\s*$' hang_sdk_stall.log | tail -6 | tr '\n' ' ' | cut -c1-800)"; fi
#  b. seed 001 on the SDK: rank 1 exits 0 at step 5. NCCL over sockets may see the peer's sockets
#     close (an error, not a hang); either way the job must end, well before the 120 s bound.
timeout 120 ddprun --standalone --nproc_per_node=2 --finish_timeout=3 --no_python /bin/sh -c "$as_host" \
  "$here/bin/train" "${train_args[@]}" --leave_at_step 5 > hang_sdk_leave.log 2>&1
rc=$?
line="$(grep -m1 -oE 'flight recorder: rank 1 never started all_reduce #[0-9]+' hang_sdk_leave.log)"
if [ $rc -eq 124 ] && [ -n "$line" ]; then result "hang, SDK on NCCL: rank 1 left (seed 001)" PASS "$line"
elif [ $rc -ne 0 ] && [ $rc -ne 124 ] && [ $rc -lt 128 ]; then
  result "hang, SDK on NCCL: rank 1 left (seed 001)" INFO "not a hang here: exit $rc: $(grep -m2 -E 'exitcode|message' hang_sdk_leave.log | tr '\n' ' ' | cut -c1-400)"
else result "hang, SDK on NCCL: rank 1 left (seed 001)" FAIL "exit $rc: $(grep -v '^\s*$' hang_sdk_leave.log | tail -6 | tr '\n' ' ' | cut -c1-800)"; fi
#  c. torch 2.x on NCCL with the Python package's heartbeats: rank 1 sleeps before step 5's
#     all_reduce, rank 0 waits in NCCL (in .item(), the stream's synchronisation). Both stacks.
cat > torch_hang.py <<'EOF'
import os, sys, time
import torch, torch.distributed as dist
import ddprun
rank = int(os.environ["RANK"])
os.environ["NCCL_HOSTID"] = "ddprun-check-%d" % rank  # two NCCL "hosts" on one GPU
torch.cuda.set_device(0)
dist.init_process_group("nccl")
t = torch.ones(1 << 16, device="cuda")

def stuck_before_all_reduce():
    time.sleep(600)

def waits_in_all_reduce(t):
    dist.all_reduce(t)
    return t[0].item()  # on NCCL the wait is here, in the stream's synchronisation

for step in range(50):
    ddprun.report_step(step)
    if rank == 1 and step == 5:
        stuck_before_all_reduce()
    waits_in_all_reduce(t)
    t.fill_(1)
    time.sleep(0.05)
EOF
timeout 120 ddprun --standalone --nproc_per_node=2 --hang_timeout=3 torch_hang.py > hang_torch.log 2>&1
rc=$?
if [ $rc -eq 124 ] && grep -q "in waits_in_all_reduce" hang_torch.log && grep -q "in stuck_before_all_reduce" hang_torch.log; then
  result "hang, torch on NCCL: both ranks' stacks" PASS "$(grep -m1 -oE 'is hung \([^)]*\)' hang_torch.log)"; else
  result "hang, torch on NCCL: both ranks' stacks" FAIL "exit $rc: $(grep -v '^\s*$' hang_torch.log | tail -8 | tr '\n' ' ' | cut -c1-800)"; fi

echo "gpu_check: $pass passed, $fail failed"
[ $fail -eq 0 ]
