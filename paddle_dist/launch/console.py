"""Rank 0's output on the launcher's terminal, as it comes, and in its log file.

A user's script (`python -m paddle_dist.launch`) shows its output without Paddle's noise
(logs.is_noise) nor its user error's line (errors.REFUSAL_LINE), which the supervisor's
report says once; nothing is shown once Ctrl+C was pressed. The log keeps everything.

Example:
    console = Console(filtered=True)
    threading.Thread(target=tee, args=(proc.stdout, log_dir / "workerlog.0", console)).start()
"""

from __future__ import annotations

import sys
from pathlib import Path

from ..errors import REFUSAL_LINE
from ..runs.logs import is_noise
from ..security import private


class Console:
    """Rank 0's output on this terminal: for a user's script without Paddle's noise
    (logs.is_noise; its log keeps everything) nor its user error's line (a typo in its
    config: errors.REFUSAL_LINE), which the report says once, and nothing once Ctrl+C was
    pressed (the ranks' KeyboardInterrupt tracebacks say nothing the one line does not)."""

    def __init__(self, filtered: bool):
        self.filtered, self.muted, self.partial = filtered, False, b""

    def mute(self) -> None:
        self.muted = True

    def write(self, chunk: bytes) -> None:
        if self.filtered:       # whole lines only: a line may come in two chunks
            lines = (self.partial + chunk).split(b"\n")
            self.partial = lines.pop()
            chunk = b"".join(line + b"\n" for line in lines if not self._noise(line))
        self._out(chunk)

    def close(self) -> None:
        rest, self.partial = self.partial, b""
        if rest and not self._noise(rest):
            self._out(rest)

    def _noise(self, line: bytes) -> bool:
        text = line.decode(errors="replace")
        return is_noise(text) or text.startswith(REFUSAL_LINE)

    def _out(self, data: bytes) -> None:
        if self.muted or not data:
            return
        try:
            sys.stdout.buffer.write(data)
            sys.stdout.flush()
        except (OSError, ValueError):
            pass


def tee(stream, path: Path, console: Console) -> None:
    """Copy a rank's output to this terminal and to its log file as it comes."""
    with open(path, "ab", opener=private.nofollow) as log:
        for chunk in iter(lambda: stream.read1(65536), b""):
            log.write(chunk)
            log.flush()
            console.write(chunk)
    console.close()
