"""runtime.observe.serverfile: how commands find the running ``vnpu serve`` -- a pid alone is not enough
(pids are reused), so the file also records the process's start time."""
from __future__ import annotations

import json
import os

from devices import procstat
from runtime.observe import serverfile


def test_the_file_names_this_process_by_pid_and_start_time(tmp_path):
    serverfile.write(tmp_path, "http://127.0.0.1:1", "/h.sqlite")
    got = serverfile.read(tmp_path)
    assert got == {"url": "http://127.0.0.1:1", "pid": os.getpid(), "history": "/h.sqlite",
                   "start_time": procstat.start_time(os.getpid())}


def test_a_reused_pid_is_not_the_server(tmp_path):
    """A server that died left its file; its pid now belongs to another live process (here: this one, with
    another start time recorded) -- that is not the server."""
    p = serverfile.write(tmp_path, "http://127.0.0.1:1", None)
    doc = json.loads(p.read_text())
    doc["start_time"] = procstat.start_time(os.getpid()) - 1
    p.write_text(json.dumps(doc))
    assert serverfile.read(tmp_path) is None
    del doc["start_time"]                    # a file without it cannot prove it names this process either
    p.write_text(json.dumps(doc))
    assert serverfile.read(tmp_path) is None
