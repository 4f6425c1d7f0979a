"""What a report quotes from a rank's output: the last lines of its log that say something
(Paddle's banners and glog INFO lines left out), and the innermost frames of a traceback or
of a stack that faulthandler dumped.

Example:
    tail_lines("runs/mnist_lenet-20261123-061500/logs/rank1.log", 6)   # [..., 'KeyError: 9']
"""

from __future__ import annotations

import re
from pathlib import Path
from typing import List, Tuple

# The first line of an exception as Python prints it: "ValueError: bad", "KeyboardInterrupt: ...".
EXCEPTION_LINE = re.compile(r"^[A-Za-z_][\w.]*(Error|Exception|Interrupt)\b.*:")
# A warning or error a logger printed: Paddle's "[2026-11-26 22:02:39,446] [ WARNING] ..."
# and the logging module's default "WARNING:root:...".
LOGGED_PROBLEM = re.compile(r"^\[[^]]*\] \[\s*(WARNING|ERROR|CRITICAL)\]|^(WARNING|ERROR|CRITICAL):")
# gloo failing to connect a pair of ranks (Paddle's gloo, tcp/pair.cc): its connect timeout
# ("TIMEOUT self_rank = 0 pair_rank = 0 ...") or a peer's listener gone ("connect ...:
# Connection refused"). A collective's timeout comes from unbound_buffer.cc instead.
GLOO_PAIR_FAILED = re.compile(r"gloo/transport/tcp/pair\.cc:\d+\].*(TIMEOUT|Connection refused)")
GLOO_START_HINT = ("gloo could not connect the ranks while the process group started (init_parallel_env); "
                   "seen now and then on a busy machine, it is not caused by the job or its data: "
                   "run the same command again")

# Rank 0 failing to listen on the store's port (Paddle's TCPStore): another process took
# the port between its pick and the store's start. Paddle 3.x with libuv aborts in
# TCPServer::create (after "create libuv server at port: N"); the older store raises
# "Bind network on IP_ANY:N failed".
STORE_BIND_FAILED = re.compile(r"Bind network on [^:\s]*:(\d+) failed|TCPServer::create")
STORE_PORT_SAID = re.compile(r"create libuv server at port: (\d+)")


def is_noise(line: str) -> bool:
    """Paddle's lines that tell a user nothing: the "Modified FLAGS detected" banner (its
    rule lines and FLAGS(...) entries) and glog INFO lines (I1125 05:44:38.1 ...).

    Example:
        is_noise("I1125 05:44:38.123 tcp_utils.cc:181] ...")     # True
    """
    text = line.strip()
    return (text.startswith("=====") or text.startswith("FLAGS(name=")
            or (len(text) > 5 and text[0] == "I" and text[1:5].isdigit()))


def tail_lines(path: str, count: int, reach: int = 40) -> List[str]:
    """The last `count` lines of a text file that are neither blank nor noise ([] when it
    cannot be read). The first exception line and the first logged warning or error among
    the last `reach` lines come first when they are not in them: a process's threads left
    several tracebacks, the cause's first; or the process said why before its traceback
    (Paddle warns that a DataLoader worker died, then its reader fails in words that do not
    say so).

    Example:
        tail_lines("log/workerlog.1", 6)
        # ['SystemError: (Fatal) DataLoader process (pid 10144) exited is killed ...', ..., 'KeyError: 9']
    """
    try:
        lines = Path(path).read_text(errors="replace").splitlines()
    except OSError:
        return []
    kept = [line for line in lines if line.strip() and not is_noise(line)]
    tail = kept[-count:]
    earlier = kept[-reach:-count] if len(kept) > count else []
    firsts = {next((i for i, line in enumerate(earlier) if pattern.match(line)), None)
              for pattern in (EXCEPTION_LINE, LOGGED_PROBLEM)} - {None}
    return [earlier[i] for i in sorted(firsts) if earlier[i] not in tail] + tail


def gloo_start_failed(text: str) -> bool:
    """Whether `text` (a traceback, or a rank's log) shows gloo failing to connect two ranks
    as the process group started: the message of tcp/pair.cc inside init_parallel_env.

    Example:
        gloo_start_failed("... in init_parallel_env ... [gloo/transport/tcp/pair.cc:584] TIMEOUT ...")  # True
    """
    return "init_parallel_env" in text and GLOO_PAIR_FAILED.search(text) is not None


def store_bind_failed(text: str) -> str:
    """The hint for `text` (a traceback, or a rank's log) that shows Paddle's store failing
    to listen on its port as the process group started; "" when it does not.

    Example:
        store_bind_failed("ValueError: (InvalidArgument) Bind network on IP_ANY:48819 failed.")
        # 'the process group's store could not listen on port 48819: ...'
    """
    found = STORE_BIND_FAILED.search(text)
    if found is None:
        return ""
    said = found.group(1) or next(iter(STORE_PORT_SAID.findall(text)[-1:]), "")
    port = f" {said}" if said else ""
    return (f"the process group's store could not listen on port{port}: another process took it after "
            "it was picked; not caused by the job: run the same command again (PORT_RANGE=low:high, below the "
            "kernel's ephemeral ports in /proc/sys/net/ipv4/ip_local_port_range, keeps other programs' "
            "connections off the ports paddle_dist and Paddle's launcher pick)")


def text_of(path: str, limit: int = 65536) -> str:
    """The last `limit` characters of a text file ("" when it cannot be read)."""
    try:
        return Path(path).read_text(errors="replace")[-limit:]
    except OSError:
        return ""


def innermost(text: str, count: int) -> Tuple[str, List[str]]:
    """(title, lines): the `count` innermost lines of a Python traceback (innermost last),
    or of a stack that faulthandler dumped (innermost first: the current thread's, which
    is the one that was stuck; a hang's stack is such a dump).

    Example:
        innermost("Current thread 0x7f (most recent call first):\\n  File ...", 6)[0]
        # 'stack (innermost first)'
    """
    lines = [line for line in text.splitlines() if line.strip()]
    heads = [i for i, line in enumerate(lines) if line.endswith("(most recent call first):")]
    if not heads:
        return "traceback (last lines)", lines[-count:]
    current = [i for i in heads if lines[i].startswith("Current thread")] or heads
    start = current[0] + 1
    end = next((i for i in heads if i > current[0]), len(lines))
    return "stack (innermost first)", lines[start:min(end, start + count)]
