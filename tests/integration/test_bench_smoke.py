"""The overhead benchmark and its load generator, at a tiny size.

No wall-clock thresholds: the checks are about completeness and consistency (every
request counted once, by the client and by the engines; ratios and CPU figures present).
"""

from __future__ import annotations

import asyncio
import json
import subprocess
import sys
from pathlib import Path

import pytest

from loadtest.loadgen import LoadGen, chat_body, summarize

ROOT = Path(__file__).resolve().parents[2]

_EVENTS = [b'data: {"choices":[{"delta":{"role":"assistant","content":""}}]}\n\n'] + [
    b'data: {"choices":[{"delta":{"content":"t%d"}}]}\n\n' % i for i in range(16)
] + [b"data: [DONE]\n\n"]


def _chunked(parts: list[bytes]) -> bytes:
    return b"".join(b"%x\r\n%s\r\n" % (len(p), p) for p in parts) + b"0\r\n\r\n"


class _StubServer:
    """Canned HTTP/1.1 replies written one byte at a time (the parser must reassemble).

    Every `fail_every`-th request gets a 500; `mode` picks chunked or content-length bodies.
    """

    def __init__(self, mode: str, fail_every: int = 0):
        self.mode, self.fail_every, self.seen = mode, fail_every, 0

    def reply(self) -> bytes:
        self.seen += 1
        if self.fail_every and self.seen % self.fail_every == 0:
            body = b'{"error": {"message": "boom"}}'
            return b"HTTP/1.1 500 Oops\r\nContent-Length: %d\r\n\r\n%s" % (len(body), body)
        head = b"HTTP/1.1 200 OK\r\nContent-Type: text/event-stream\r\n"
        if self.mode == "chunked":
            return head + b"Transfer-Encoding: chunked\r\n\r\n" + _chunked(_EVENTS)
        body = b"".join(_EVENTS)
        return head + b"Content-Length: %d\r\n\r\n" % len(body) + body

    async def handle(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        try:
            while True:
                head = await reader.readuntil(b"\r\n\r\n")
                length = next(
                    int(line.split(b":")[1]) for line in head.split(b"\r\n")
                    if line.lower().startswith(b"content-length")
                )
                await reader.readexactly(length)
                for b in self.reply():
                    writer.write(bytes([b]))
                    await writer.drain()
        except (asyncio.IncompleteReadError, ConnectionError):
            pass
        finally:
            writer.close()


@pytest.mark.parametrize("mode", ["chunked", "length"])
@pytest.mark.parametrize("client", ["raw", "aiohttp"])
async def test_loadgen_counts_every_request_once(mode: str, client: str) -> None:
    stub = _StubServer(mode, fail_every=7)
    server = await asyncio.start_server(stub.handle, "127.0.0.1", 0)
    port = server.sockets[0].getsockname()[1]
    try:
        gen = LoadGen([f"http://127.0.0.1:{port}"], 3, body=chat_body(), client=client, timeout_s=10)
        try:
            res = await gen.run(requests=70)
        finally:
            await gen.close()
    finally:
        server.close()
        await server.wait_closed()
    s = summarize(res)
    assert stub.seen == 70
    assert (s["requests"], s["ok"], s["errors"]) == (70, 60, 10)
    assert all(k.startswith("HTTP 500") for k in s["error_kinds"])
    assert s["events_per_reply"] == [len(_EVENTS)]
    assert all(x.ttft_s <= x.latency_s for x in res.samples if x.ok)
    assert s["latency_ms"]["p50"] <= s["latency_ms"]["p99"]


async def test_loadgen_round_robins_over_targets() -> None:
    stubs = [_StubServer("chunked") for _ in range(3)]
    servers = [await asyncio.start_server(s.handle, "127.0.0.1", 0) for s in stubs]
    urls = [f"http://127.0.0.1:{srv.sockets[0].getsockname()[1]}" for srv in servers]
    try:
        gen = LoadGen(urls, 4, client="raw", timeout_s=10)
        try:
            res = await gen.run(requests=30)
        finally:
            await gen.close()
    finally:
        for srv in servers:
            srv.close()
    assert [s.seen for s in stubs] == [10, 10, 10]
    assert summarize(res)["ok"] == 30


def test_bench_overhead_smoke(tmp_path: Path) -> None:
    out, md = tmp_path / "bench.json", tmp_path / "bench.md"
    n, warm = 100, 12
    proc = subprocess.run(
        [sys.executable, "-m", "loadtest.bench_overhead", "--requests", str(n), "--warmup", str(warm),
         "--concurrency", "1,4", "--modes", "stream,plain", "--repeats", "1", "--json", str(out),
         "--markdown", str(md)],
        cwd=ROOT, capture_output=True, text=True, timeout=240,
    )
    assert proc.returncode == 0, proc.stderr[-4000:]
    r = json.loads(out.read_text())

    cells = {(c["target"], c["mode"], c["concurrency"]): c for c in r["cells"]}
    assert set(cells) == {(t, m, c) for t in ("direct", "router") for m in ("stream", "plain") for c in (1, 4)}
    for (target, mode, conc), c in cells.items():
        assert (c["requests"], c["ok"], c["errors"]) == (n, n, 0), (target, conc, c["error_kinds"])
        assert c["warmup_ok"] == c["warmup_requests"] >= warm
        # The engines saw each request exactly once (no retries, no losses).
        assert c["engine_chat_requests"] == {"completed": n + c["warmup_requests"]}, (target, conc)
        assert c["rps"] > 0
        lat, ttft = c["latency_ms"], c["ttft_ms"]
        assert 0 < lat["p50"] <= lat["p90"] <= lat["p99"] <= lat["p999"]
        assert 0 < ttft["p50"] <= lat["p50"]
        assert set(c["cpu_ms_per_req"]) == {"simulator", "router", "loadgen"}
        assert all(v >= 0 for v in c["cpu_ms_per_req"].values())
    # Same reply shape through the router as from the engines (usage chunk hidden again).
    for conc in (1, 4):
        shape = cells[("direct", "stream", conc)]["events_per_reply"]
        assert len(shape) == 1 and shape[0] >= 17  # role/content chunks + [DONE]
        assert cells[("router", "stream", conc)]["events_per_reply"] == shape
        assert cells[("router", "plain", conc)]["events_per_reply"] == [0]  # one JSON body

    assert sum(cells[("router", "stream", c)]["cpu_ms_per_req"]["router"] for c in (1, 4)) > 0
    assert set(r["comparison"]["router"]) == {"stream", "plain"}
    plain = r["comparison"]["router"]["plain"]["by_concurrency"]["4"]
    assert len(plain["added_p99_ms_runs"]) == 1 and plain["added_p999_ms"] is not None
    cmp = r["comparison"]["router"]["stream"]
    assert cmp["headline"]["throughput_ratio_at_c4"] > 0
    assert cmp["headline"]["cpu_ms_per_req_at_c1"] is not None
    assert set(cmp["by_concurrency"]) == {"1", "4"}
    # no peer ran: every target check is undecided (None), never a silent pass
    assert r["goals"]["all_runs"]["router"] and set(r["goals"]["all_runs"]["router"].values()) == {None}
    assert r["meta"]["router_process_tree_size"] >= 2  # supervisor + at least one worker
    # c=1 also ran paired: direct and router requests alternating in one window
    paired = {(c["target"], c["mode"], c["concurrency"]): c for c in r["paired_cells"]}
    assert set(paired) == {(t, m, 1) for t in ("direct", "router") for m in ("stream", "plain")}
    for key, c in paired.items():
        assert (c["requests"], c["ok"], c["errors"]) == (n, n, 0), (key, c["error_kinds"])
        assert 0 < c["latency_ms"]["p50"] <= c["latency_ms"]["p99"]
    assert paired[("router", "stream", 1)]["events_per_reply"] == cells[("direct", "stream", 1)]["events_per_reply"]
    row = r["paired_comparison"]["router"]["stream"]["1"]
    assert len(row["added_p99_ms_runs"]) == 1 and row["added_p50_ms"] is not None
    text = md.read_text()
    assert "| router | stream |" in text and "added p99 c=4 plain" in text
    assert "| router (paired) |" in text and "| router | stream | 1 |" in text


_ACCEPT_AND_REPORT = """
import socket
srv = socket.socket(); srv.bind(("127.0.0.1", 0)); srv.listen(1)
cli = socket.create_connection(srv.getsockname())
conn, _ = srv.accept()
print(conn.getsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY),
      cli.getsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY))
"""


@pytest.mark.parametrize("preload", [False, True])
def test_nodelay_shim_sets_tcp_nodelay(preload: bool, tmp_path: Path) -> None:
    """The preload shim the benchmark gives sglang-router: accepted and connected sockets."""
    from loadtest.procs import nodelay_shim

    env = {"PATH": "/usr/bin:/bin"}
    if preload:
        env["LD_PRELOAD"] = str(nodelay_shim(tmp_path))
    out = subprocess.run([sys.executable, "-c", _ACCEPT_AND_REPORT], env=env, capture_output=True, text=True,
                         timeout=30, check=True).stdout.split()
    accepted, connected = (int(x) != 0 for x in out)
    assert (accepted, connected) == (preload, preload)
