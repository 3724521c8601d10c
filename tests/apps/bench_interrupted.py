"""A benchmark interrupted twice: SIGTERM, then another while its control plane is being torn down (a supervisor
that signals the process and then its group, or an impatient user). Prints the control plane's directory."""

from __future__ import annotations

import os
import signal
import threading
import time

from benchmarks import common


def _twice() -> None:
    os.kill(os.getpid(), signal.SIGTERM)
    time.sleep(0.3)  # the teardown is under way: it stops the control plane's processes one by one
    os.kill(os.getpid(), signal.SIGTERM)


if __name__ == "__main__":
    with common.control_plane() as cp:
        print(f"workdir {cp.workdir}", flush=True)
        threading.Thread(target=_twice, daemon=True).start()
        time.sleep(120)
