"""`python -m train KEY=VALUE ...` whose deletion of pruned checkpoints (the `.trash-step_*` folders) starts
$SLOW_TRASH_S late (default 3 s), as a large checkpoint's takes long on a real disk (1.7 GB for the default
model): the deletion is still running when the run ends. Run by tests/test_checkpoint_trash.py."""

import os
import shutil
import sys
import time
from pathlib import Path

from infra.checkpoint.layout import TRASH
from infra.process_exit import exit_now

SLOW_S = float(os.environ.get("SLOW_TRASH_S", "3"))


def _slow_for_trash(rmtree):
    def wrapped(path, *args, **kwargs):
        if Path(path).name.startswith(TRASH):
            time.sleep(SLOW_S)
        return rmtree(path, *args, **kwargs)

    return wrapped


if __name__ == "__main__":
    shutil.rmtree = _slow_for_trash(shutil.rmtree)
    from orchestration.train_cli import main

    exit_now(main(sys.argv[1:]))  # as train/__main__.py ends every run
