"""The worker of the bare-root install test (scripts/bare_root_check.sh runs it under the installed
ddprun): prints the launcher's environment on one line and reports a step through the ddprun Python
package, as a training script would. Exits 1 when a variable is missing, or when `import ddprun`
fails, unless PROG_DDPRUN_OPTIONAL=1 (the .deb may ship the binaries only).
PROG_HOLD=PATH: then it keeps running until PATH exists (at most 60 s, then exit 1), so that the
check can scrape the agent's metrics port while its workers run."""

import os
import sys
import time

NAMES = ("RANK", "LOCAL_RANK", "WORLD_SIZE", "MASTER_ADDR", "MASTER_PORT")

missing = [n for n in NAMES if not os.environ.get(n)]
if missing:
    print("prog: missing %s" % " ".join(missing), flush=True)
    sys.exit(1)

try:
    import ddprun
except ImportError as e:
    if os.environ.get("PROG_DDPRUN_OPTIONAL") != "1":
        print("prog: import ddprun failed: %s" % e, flush=True)
        sys.exit(1)
    ddprun = None
if ddprun is not None:
    ddprun.report_step(1)

print("prog: " + " ".join("%s=%s" % (n, os.environ[n]) for n in NAMES)
      + " ddprun_module=%s" % (ddprun.__file__ if ddprun is not None else "none"), flush=True)

hold = os.environ.get("PROG_HOLD")
if hold:
    print("prog: RANK=%s holding until %s exists" % (os.environ["RANK"], hold), flush=True)
    deadline = time.monotonic() + 60
    while not os.path.exists(hold):
        if time.monotonic() > deadline:
            print("prog: RANK=%s: %s did not appear within 60 s" % (os.environ["RANK"], hold), flush=True)
            sys.exit(1)
        time.sleep(0.05)
