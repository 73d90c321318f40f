#!/usr/bin/env python3
"""timebox.py - runs a command under a hard time limit; when the limit hits, says what was running.

usage: timebox.py -t SECS [--label TEXT] [--times FILE] [--ps] -- CMD [ARG...]

CMD's stdout and stderr pass through unchanged (and unbuffered). Both are watched for libtest's
progress lines: with --test-threads=1 libtest prints "test NAME ... " before a test runs and its
result ("ok", "FAILED", "ignored") after it, so the test in flight is always known. When SECS run
out, CMD's process group gets SIGTERM, then SIGKILL 5 s later, and one line on stderr names the
limit, how long the run had taken and the test that was running (and for how long), or else the
last line CMD printed. Used by vmrun.sh (the VM's console), with-kernel.sh (on the host) and
scripts/test.sh (every tier).

  --label TEXT  prefix of the timeout line (default "timebox")
  --times FILE  append "SECONDS NAME" for every test that finished (per-test timings)
  --ps          on timeout, before the SIGTERM, print the process tree with each process's state
                and kernel wait channel (`ps --forest`): what a hung test was waiting for
exit: CMD's status (128+N if killed by signal N); 124 when the limit hit.
"""

import argparse
import os
import re
import selectors
import signal
import subprocess
import sys
import time

START = re.compile(r"^test (\S+) \.\.\. ")
# What libtest prints after "test NAME ... ": "ok", "FAILED", "ignored" or "ignored, <reason>".
RESULT = re.compile(r"^(ok|FAILED|ignored(?:, .*)?)$")
GRACE = 5.0


class Tracker:
    """Follows libtest's progress (and the last line) across the watched streams."""

    def __init__(self, t0, times):
        self.t0 = t0
        self.times = times
        self.running = None  # (name, start) of the test in flight
        self.last_line = None  # (line, time) of the last non-empty line
        self.partial = {}  # per stream: the incomplete last line

    def feed(self, stream, data, now):
        text = self.partial.get(stream, "") + data.decode("utf-8", "replace").replace("\r", "")
        *lines, rest = text.split("\n")
        for line in lines:
            self.line(line, now)
        self.partial[stream] = rest
        # "test NAME ... " is printed without a newline until the test finishes.
        m = START.match(rest)
        if m and (self.running is None or self.running[0] != m.group(1)):
            self.started(m.group(1), now)

    def started(self, name, now):
        self.running = (name, now)

    def line(self, line, now):
        if line.strip():
            self.last_line = (line.strip(), now)
        m = START.match(line)
        if m:
            if self.running is None or self.running[0] != m.group(1):
                self.started(m.group(1), now)
            rest = line[m.end():]
        elif line.startswith("test result:"):
            self.running = None
            return
        else:
            rest = line
        if self.running and RESULT.match(rest.strip()):
            name, since = self.running
            self.running = None
            if self.times:
                with open(self.times, "a") as f:
                    f.write("%.1f %s\n" % (now - since, name))

    def what(self, now):
        if self.running:
            name, since = self.running
            return "test `%s` was running (for %.1fs, since +%.1fs)" % (name, now - since, since - self.t0)
        if self.last_line:
            line, at = self.last_line
            return "no test was running; the last output (at +%.1fs) was: %s" % (at - self.t0, line[:200])
        return "it had printed nothing"


def show_processes(label):
    """The process tree, on stderr: which child a hung test waits for, and where in the kernel."""
    try:
        out = subprocess.run(["ps", "-e", "--forest", "-o", "pid,ppid,stat,etimes,wchan:28,args"],
                             capture_output=True, text=True, timeout=20, check=False).stdout
    except (OSError, subprocess.TimeoutExpired) as e:
        print("%s: ps failed: %s" % (label, e), file=sys.stderr)
        return
    # Kernel threads ("[kworker/0:1]") are left out, not the helpers they run (a modprobe the
    # kernel started for an nft expression shows up under one).
    lines = [ln for ln in out.splitlines()
             if not re.sub(r"^\s*(\S+\s+){5}[\s|\\_]*", "", ln).startswith("[")]
    print("%s: the processes at the timeout (kernel threads left out):\n%s"
          % (label, "\n".join(lines)), file=sys.stderr, flush=True)


def main():
    ap = argparse.ArgumentParser(usage=__doc__.split("\n\n")[1])
    ap.add_argument("-t", type=float, required=True, dest="limit")
    ap.add_argument("--label", default="timebox")
    ap.add_argument("--times")
    ap.add_argument("--ps", action="store_true")
    ap.add_argument("cmd", nargs=argparse.REMAINDER)
    args = ap.parse_args()
    cmd = args.cmd[1:] if args.cmd[:1] == ["--"] else args.cmd
    if not cmd:
        ap.error("no command given")

    t0 = time.monotonic()
    try:
        child = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE, start_new_session=True)
    except OSError as e:
        print("%s: cannot start %s: %s" % (args.label, cmd[0], e), file=sys.stderr)
        return 127
    tracker = Tracker(t0, args.times)

    def signal_group(sig):
        try:
            os.killpg(child.pid, sig)
        except ProcessLookupError:
            pass

    # Ctrl-C / a TERM from outside reach CMD's own process group too.
    for sig in (signal.SIGINT, signal.SIGTERM, signal.SIGHUP):
        signal.signal(sig, lambda s, _f: signal_group(s))

    sel = selectors.DefaultSelector()
    outs = {child.stdout.fileno(): sys.stdout.buffer, child.stderr.fileno(): sys.stderr.buffer}
    for fd in outs:
        os.set_blocking(fd, False)
        sel.register(fd, selectors.EVENT_READ)
    deadline = t0 + args.limit
    timed_out = False
    killed_at = None
    exited_at = None
    while outs:
        now = time.monotonic()
        if not timed_out and now >= deadline:
            timed_out = True
            print("%s: TIMEOUT: limit %gs reached after %.1fs; %s"
                  % (args.label, args.limit, now - t0, tracker.what(now)), file=sys.stderr, flush=True)
            if args.ps:
                show_processes(args.label)
            signal_group(signal.SIGTERM)
            killed_at = now
        if killed_at is not None and now >= killed_at + GRACE:
            signal_group(signal.SIGKILL)
            killed_at = float("inf")
        if exited_at is None and child.poll() is not None:
            exited_at = now
        # Something CMD started in the background may hold the pipes open: stop reading soon
        # after CMD itself is gone.
        if exited_at is not None and now >= exited_at + 2:
            break
        wait = min(x for x in (deadline, (killed_at or deadline) + GRACE, now + 1) if x > now) - now
        for key, _ in sel.select(timeout=max(0.05, wait)):
            fd = key.fd
            try:
                data = os.read(fd, 65536)
            except BlockingIOError:
                continue
            if not data:
                sel.unregister(fd)
                del outs[fd]
                continue
            outs[fd].write(data)
            outs[fd].flush()
            tracker.feed(fd, data, time.monotonic())
    rc = child.wait()
    if timed_out:
        return 124
    return 128 - rc if rc < 0 else rc


if __name__ == "__main__":
    sys.exit(main())
