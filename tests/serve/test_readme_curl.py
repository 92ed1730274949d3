"""The README's quick start works as written (issue 30): its ``curl`` commands -- and those of
docs/serving/index.md -- are taken from the Markdown, run by the real ``curl`` against a real ``vnpu serve
--config serve.yaml`` (the shipped file, its API keys; in-process devices, port 0 instead of 8000) and answer
200 with what they ask for; the same request without its ``Authorization`` header is 401, so a curl that
forgets the key cannot pass.  One server for the module; SIGTERM drains it, exit 0.
"""
from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
from pathlib import Path

import pytest
from serve_cli import ServeProcess

pytestmark = pytest.mark.serve

ROOT = Path(os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__)))))


def bash_blocks(md: str) -> list[str]:
    return re.findall(r"^```bash\n(.*?)^```", md, re.S | re.M)


def curl_commands(md: str) -> list[str]:
    """Every ``curl`` command line of the Markdown's bash blocks, continuation lines joined (not the
    ``until curl ...; do`` wait loop); a pipe after it (``| grep``) stays."""
    out = []
    for block in bash_blocks(md):
        lines = block.replace("\\\n", " ").splitlines()
        out += [re.sub(r"\s+#[^'\"]*$", "", ln).strip() for ln in lines if ln.lstrip().startswith("curl ")]
    return out


def shipped_port() -> int:
    """The port the shipped serve.yaml names (what the documented curls address)."""
    import yaml
    return int(yaml.safe_load((ROOT / "serve.yaml").read_text())["server"]["port"])


def run_curl(cmd: str, url: str) -> tuple[int, str]:
    """(HTTP status, body) of a README curl, pointed at ``url`` (the test server, on a free port) instead of
    the shipped serve.yaml's address; the status comes from curl's ``-w`` (added), the body is what the
    command prints (after its own pipe, if any)."""
    hostport, port = url.removeprefix("http://"), shipped_port()
    cmd = cmd.replace(f"localhost:{port}", hostport).replace(f"127.0.0.1:{port}", hostport)
    head, _, pipe = cmd.partition(" | ")
    head = head.replace("curl ", "curl -w '\\n%{http_code}' ", 1)
    assert shutil.which("curl"), "the README's examples run curl: install it"
    p = subprocess.run(["bash", "-c", f"set -o pipefail; {head}"], capture_output=True, text=True, timeout=120)
    assert p.returncode == 0, (cmd, p.stderr)
    body, _, status = p.stdout.rpartition("\n")
    if pipe:
        body = subprocess.run(["bash", "-c", pipe], input=body, capture_output=True, text=True, timeout=30).stdout
    return int(status), body


def without_key(cmd: str) -> str:
    out = re.sub(r"-H 'Authorization: Bearer [^']*'\s*", "", cmd)
    assert out != cmd, f"the README curl carries no API key: {cmd}"
    return out


@pytest.fixture(scope="module")
def server(tmp_path_factory):
    """``vnpu serve --config serve.yaml`` as the quick start runs it, on 3 in-process devices (the shipped
    placement: smollm2@0, fallback 2, minilm-l6@1), on a free port."""
    srv = ServeProcess(tmp_path_factory.mktemp("readme"), "--config", ROOT / "serve.yaml", "--port", "0", devices=3)
    try:
        srv.wait_for("vnpu serve: ready")
        yield srv.url
        assert srv.stop() == 0, srv.stderr[-3000:]
        assert any(ln.endswith("vnpu serve: drained, bye") for ln in srv.lines), srv.lines
    finally:
        srv.stop()


def test_the_readme_quick_start_has_its_curls():
    cmds = curl_commands((ROOT / "README.md").read_text())
    assert any("/v1/chat/completions" in c for c in cmds) and any("/v1/embeddings" in c for c in cmds), cmds


def test_readme_curls_answer_with_the_shipped_keys(server):
    cmds = curl_commands((ROOT / "README.md").read_text())
    for cmd in cmds:
        status, body = run_curl(cmd, server)
        assert status == 200, (cmd, status, body)
        r = json.loads(body)
        if "/v1/chat/completions" in cmd:
            asked = json.loads(re.search(r"-d '(.*)'", cmd).group(1))
            assert r["object"] == "chat.completion" and r["choices"][0]["message"]["content"]
            assert 0 < r["usage"]["completion_tokens"] <= asked["max_tokens"]
        elif "/v1/embeddings" in cmd:
            assert r["object"] == "list" and len(r["data"]) == 1 and len(r["data"][0]["embedding"]) == 384
        status, body = run_curl(without_key(cmd), server)
        assert status == 401 and json.loads(body)["error"]["code"] == "invalid_api_key", (cmd, status, body)


def test_serving_page_curls_answer_with_the_shipped_keys(server):
    cmds = curl_commands((ROOT / "docs" / "serving" / "index.md").read_text())
    assert len(cmds) == 3, cmds
    for cmd in cmds:
        status, body = run_curl(cmd, server)
        assert status == 200, (cmd, status, body)
        if "/metrics" in cmd:
            assert re.search(r"^vnpu:generation_tokens_total\{", body, re.M), body[:500]
        elif '"stream": true' in cmd:
            events = [ln[6:] for ln in body.splitlines() if ln.startswith("data: ")]
            assert events[-1] == "[DONE]"
            text = "".join(c["text"] for e in events[:-1] for c in json.loads(e)["choices"])
            assert ", 6" not in text and text              # the stop string is held back, never leaked
        else:
            assert json.loads(body)["choices"][0]["message"]["content"]
        status, _ = run_curl(without_key(cmd), server)
        assert status == 401, cmd
