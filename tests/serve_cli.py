"""``vnpu serve`` as a user runs it, for the serve tests: the real command in a subprocess (in-process devices,
``VNPU_BACKEND=local``), stdout and stderr piped (not a terminal), every stdout line kept in order and handed
to waiters as it arrives -- a test waits for a line, never sleeps."""
from __future__ import annotations

import os
import queue
import signal
import subprocess
import sys
import threading
import time


def serve_env(home, devices: int = 1) -> dict:
    return dict(os.environ, VNPU_HOME=str(home), VNPU_BACKEND="local", VNPU_DEVICES=str(devices),
                OPENBLAS_NUM_THREADS="1", OMP_NUM_THREADS="1", MKL_NUM_THREADS="1")


class ServeProcess:
    """``vnpu serve ARGV`` in a subprocess; :attr:`lines`: its stdout lines so far (without newlines)."""

    def __init__(self, home, *argv, devices: int = 1):
        self.p = subprocess.Popen([sys.executable, "-m", "runtime.cli", "serve", *map(str, argv)],
                                  env=serve_env(home, devices), stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                                  text=True)
        self.lines: list[str] = []
        self._new: queue.Queue = queue.Queue()
        self.url: str | None = None
        self.stderr = ""
        threading.Thread(target=self._read, daemon=True).start()

    def _read(self) -> None:
        for x in self.p.stdout:
            self._new.put(x.rstrip("\n"))
        self._new.put(None)                                  # the server exited

    def wait_for(self, pred, timeout: float = 240.0) -> str:
        """The first new line for which ``pred(line)`` holds (a str: the line contains it)."""
        test = (lambda ln: pred in ln) if isinstance(pred, str) else pred
        deadline = time.monotonic() + timeout
        while True:
            line = self._new.get(timeout=max(0.01, deadline - time.monotonic()))
            assert line is not None, f"vnpu serve exited ({self.p.wait()}): {self.p.stderr.read()[-3000:]}"
            self.lines.append(line)
            if "listening on" in line and self.url is None:
                self.url = line.rsplit(" ", 1)[1]
            if test(line):
                return line

    def stop(self) -> int:
        """SIGTERM (a drain), wait, then keep what is left of stdout and stderr; the exit code."""
        if self.p.poll() is None:
            self.p.send_signal(signal.SIGTERM)
        try:
            rc = self.p.wait(120)
        finally:
            if self.p.poll() is None:
                self.p.kill()
                self.p.wait()
        if not self.p.stderr.closed:                          # the first stop: the rest of the output
            while (line := self._new.get(timeout=30)) is not None:
                self.lines.append(line)
            self.stderr = self.p.stderr.read()
            self.p.stderr.close()
        return rc
