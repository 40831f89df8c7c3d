"""Worker for test_env_contract: writes its whole environment, plus a few facts about it, as
JSON to OUT_DIR/env_<RANK>.json. Needs no torch, so it starts fast under any launcher."""

import json
import os
import sys

out_dir = sys.argv[1]
error_file = os.environ.get("TORCHELASTIC_ERROR_FILE", "")
probe = {
    "pid": os.getpid(),
    "error_file_dir_exists": bool(error_file) and os.path.isdir(os.path.dirname(error_file)),
    "error_file_exists": bool(error_file) and os.path.exists(error_file),
    "argv": sys.argv[1:],
}
path = os.path.join(out_dir, "env_%s.json" % os.environ["RANK"])
with open(path + ".tmp", "w") as f:
    json.dump({"environ": dict(os.environ), "probe": probe}, f, indent=1, sort_keys=True)
os.replace(path + ".tmp", path)
