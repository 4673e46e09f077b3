"""A child for tests of ChildProcess itself: it appends a line to $TICK_FILE every 5 ms, in its main thread and in
a thread of its own (and, with $TICK_ESCAPE set, in a process that left its process group), until killed."""

import os
import subprocess
import sys
import threading
import time


def _tick(path: str, who: str) -> None:
    while True:
        with open(path, "a") as f:
            f.write(f"{who}\n")
        time.sleep(0.005)


if __name__ == "__main__":
    if os.environ.get("TICK_ESCAPE"):
        subprocess.Popen([sys.executable, "-c", "import sys; sys.path.insert(0, sys.argv[1]); "
                          "from tests.sandbox.ticker import _tick; _tick(sys.argv[2], 'escapee')",
                          os.getcwd(), os.environ["TICK_FILE"]], start_new_session=True)
    threading.Thread(target=_tick, args=(os.environ["TICK_FILE"], "thread"), daemon=True).start()
    _tick(os.environ["TICK_FILE"], "main")
