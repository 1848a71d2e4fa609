"""The console's request bodies against a real `skiplock api` (gunicorn, two workers) over real
HTTP, as an anonymous attacker sends them (issue 37): every POST /ui/... form is parsed before its
CSRF check, so its body is bounded and a multipart one is refused before any of it is read. The
proof that nothing was read: the refusal arrives while most of the declared body is still unsent
(a server that reads or parses the body would wait for it, and werkzeug would spool the multipart
file part to an unlinked temporary file, which no directory listing shows), and no worker's peak
memory grew."""

from __future__ import annotations

import http.client
import time
from pathlib import Path

from tests.acceptance.test_api_load import _tree
from tests.acceptance.test_api_process import start_api, wait_ready
from tests.support.harness import free_port

MIB = 2**20
# how long a refusal may take to arrive (a server waiting for the body never sends one)
ANSWER_DEADLINE_SECONDS = 20


def _peak_rss_kib(pid: int) -> int:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmHWM:"):
            return int(line.split()[1])
    raise AssertionError(f"no VmHWM for pid {pid}")


def _send_partly(port: int, headers: dict, first: bytes) -> http.client.HTTPResponse:
    """POST /ui/login with `headers` and only the first bytes of its body; the answer."""
    conn = http.client.HTTPConnection("127.0.0.1", port, timeout=ANSWER_DEADLINE_SECONDS)
    conn.putrequest("POST", "/ui/login")
    for name, value in headers.items():
        conn.putheader(name, value)
    conn.endheaders()
    conn.send(first)
    response = conn.getresponse()
    response.body = response.read()
    conn.close()
    return response


def test_large_and_multipart_posts_are_refused_before_their_body_is_read(processes, db_url):
    port = free_port()
    proc = start_api(processes, db_url, port)
    wait_ready(proc, f"http://127.0.0.1:{port}")
    # the master answers /readyz before it has forked every worker: wait for both
    deadline = time.monotonic() + ANSWER_DEADLINE_SECONDS
    while len(workers := _tree(proc.pid)[1:]) < 2 and time.monotonic() < deadline:
        time.sleep(0.05)
    assert len(workers) == 2
    # each worker serves one request first, so that its own warm-up is not counted below
    for _ in range(4):
        warm = http.client.HTTPConnection("127.0.0.1", port, timeout=ANSWER_DEADLINE_SECONDS)
        warm.request("GET", "/ui/login")
        assert warm.getresponse().status == 200
        warm.close()
    before = {pid: _peak_rss_kib(pid) for pid in workers}

    boundary = "skiplock-probe"
    part = (f"--{boundary}\r\nContent-Disposition: form-data; name=\"token\"; filename=\"t.bin\"\r\n"
            "Content-Type: application/octet-stream\r\n\r\n").encode()
    refusals = []
    for _ in range(4):  # to both workers, whichever takes the connection
        refusals.append(_send_partly(port, {"Content-Length": str(256 * MIB),
                                            "Content-Type": f"multipart/form-data; boundary={boundary}"},
                                     part + b"a" * MIB))
    # a form declaring more than the limit; and one sent chunked, which declares no length
    refusals.append(_send_partly(port, {"Content-Length": str(64 * 1024 + 1),
                                        "Content-Type": "application/x-www-form-urlencoded"}, b"token="))
    for response in refusals[:4]:
        assert response.status == 415, response.body[:300]
        assert b"request.unsupported_media_type" in response.body
        assert b"the console reads only application/x-www-form-urlencoded forms, not multipart/form-data" \
            in response.body
    assert refusals[4].status == 413 and b"the console&#39;s limit is 65536" in refusals[4].body

    chunked = http.client.HTTPConnection("127.0.0.1", port, timeout=ANSWER_DEADLINE_SECONDS)
    body = b"token=" + b"a" * (200 * 1024)  # under werkzeug's own form limit, over the console's
    chunked.request("POST", "/ui/login", body=iter([body[i:i + 8192] for i in range(0, len(body), 8192)]),
                    headers={"Content-Type": "application/x-www-form-urlencoded"}, encode_chunked=True)
    answer = chunked.getresponse()
    assert answer.status == 413 and b"over the console&#39;s limit of 65536 bytes" in answer.read()
    chunked.close()

    grown = {pid: _peak_rss_kib(pid) - kib for pid, kib in before.items()}
    assert all(kib < 4 * 1024 for kib in grown.values()), f"peak RSS grew by {grown} KiB"
    assert proc.alive()
