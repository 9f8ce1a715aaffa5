"""Worker for tests/test_dist_timeout.py (torchrun, gloo): rank 1 "generates" for SKEW_S before the first
collective after generation (`all_reduce_max`, as `Policy.micro_batches` calls it), rank 0 waits there.

Args: FOLDER TIMEOUT. TIMEOUT `project`: the group joined as the trainer joins it (the run config's
`dist_timeout_s` default); else that many seconds. Each rank writes FOLDER/rank<r>.json: {"ok": bool,
"error": first line of the collective's error}.
"""

import dataclasses
import json
import sys
import time
from pathlib import Path

from infra.process_exit import exit_now
from train.config import RunConfig
from train.policy.distributed import all_reduce_max, init_distributed

SKEW_S = 3.0


def main(folder: str, timeout: str) -> None:
    default = {f.name: f.default for f in dataclasses.fields(RunConfig)}["dist_timeout_s"]
    rank, _ = init_distributed(default if timeout == "project" else float(timeout))
    if rank == 1:
        time.sleep(SKEW_S)  # the slow rank's generation
    try:
        all_reduce_max(rank)
        result = {"ok": True, "error": ""}
    except Exception as err:  # gloo's timeout (a RuntimeError), or the peer gone after it
        result = {"ok": False, "error": (str(err).strip().splitlines() or [""])[0][:300]}
    (Path(folder) / f"rank{rank}.json").write_text(json.dumps(result))


if __name__ == "__main__":
    main(sys.argv[1], sys.argv[2])
    exit_now(0)  # results are on disk: no interpreter teardown (infra/process_exit.py says why)
