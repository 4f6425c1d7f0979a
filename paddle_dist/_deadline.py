"""Kill a process that missed a deadline. Run as a plain script (it imports no Paddle).

Why a separate process: while a rank waits in Paddle's rendezvous, the C++ code holds
Python's GIL, so no thread of the rank itself can run to notice the time.

Usage: python _deadline.py PID SECONDS MESSAGE [STATUS_FILE RANK]
Exits quietly when its stdin closes (the rank finished in time, or died); otherwise, after
SECONDS, prints MESSAGE, records it in STATUS_FILE (a paddle_dist rank status) and
SIGKILLs PID.
"""

import json
import os
import select
import signal
import socket
import sys
import time

EXIT_RENDEZVOUS = 3


def main(pid: int, seconds: float, message: str, status_file: str = "", rank: str = "0") -> int:
    ready, _, _ = select.select([sys.stdin], [], [], seconds)
    if ready:
        return 0
    sys.stderr.write(f"paddle_dist: {message}\n")
    sys.stderr.flush()
    if status_file:
        record = {"rank": int(rank), "pid": pid,
                  "host": socket.gethostname(), "state": "failed", "step": 0, "time": time.time(),
                  "error_type": "RendezvousTimeout", "error": message,
                  "exit_code": EXIT_RENDEZVOUS}
        os.makedirs(os.path.dirname(status_file), exist_ok=True)
        tmp = f"{status_file}.tmp-{os.getpid()}"
        with open(tmp, "w") as f:
            json.dump(record, f)
        os.replace(tmp, status_file)
    os.kill(pid, signal.SIGKILL)
    return 0


if __name__ == "__main__":
    sys.exit(main(int(sys.argv[1]), float(sys.argv[2]), sys.argv[3], *sys.argv[4:6]))
