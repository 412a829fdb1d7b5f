"""Fuzz a real router in front of real simulated engines with generated requests.

    python -m loadtest.fuzz_router --requests 100000 --seed 1 --concurrency 12

Starts the simulator (3 fast engines serving "demo" and two LoRA adapters) and the router
(`python -m kthena_router.cli`, 2 workers, prefix-cache scheduling, --max-body-bytes
65536), or targets a running pair (--router/--router-admin/--sim-admin). Sends the cases of
loadtest/fuzz_cases.py over raw sockets (responses parsed with h11), --concurrency at a time.

Invariants; any violation is counted by kind and makes the exit status 1:
  * no 5xx made by the router (`router_5xx`); a 5xx the simulator logged for that request
    id is `upstream_5xx` (none expected: the engines are healthy);
  * every error reply to a well-formed request is OpenAI-style JSON (`non_openai_error`);
  * no reply to a well-formed request (`no_response`), an unparsable reply
    (`malformed_response`), a stream ending in an error event or without [DONE]
    (`stream_error`), a traceback or backend address in a reply (`leak`);
  * no hang: each exchange within --timeout (`hang`);
  * a valid request sent next on the same connection is served (`follow_up`);
  * the router stays up: process alive, /readyz 200, same worker processes after every
    batch (`crash`), and a normal request is served at the end (`final_request`).
Loose cases (broken framing) may be refused by the HTTP layer in its own format; those
replies are counted (`info`), not failures. Imports nothing from kthena_router.
"""

from __future__ import annotations

import argparse
import asyncio
import collections
import json
import re
import socket
import sys
import tempfile
import threading
import time
import urllib.error
import urllib.request
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import h11

from .demo import DEFAULT_CONFIG, REPO, Child, demo_config, wait_router_ready, wait_simulator_ready
from .fuzz_cases import CHAT, MAX_BODY_BYTES, RID_MARK, Case, dumps, generate, http_request, valid_body
from .ports import free_ports

HOST = "127.0.0.1"
ROUTER_CONFIG = REPO / "configs" / "scheduling" / "prefix-cache.yaml"
_ADDR = re.compile(rb"127\.0\.0\.1:(\d+)|localhost:(\d+)")


@dataclass
class Reply:
    status: int | None = None
    headers: dict[bytes, bytes] = field(default_factory=dict)
    body: bytes = b""
    complete: bool = False  # EndOfMessage seen
    error: str = ""  # transport or parse problem


@dataclass
class Report:
    sent: int = 0
    by_kind_status: dict[str, collections.Counter[str]] = field(
        default_factory=lambda: collections.defaultdict(collections.Counter))
    failures: collections.Counter[str] = field(default_factory=collections.Counter)
    info: collections.Counter[str] = field(default_factory=collections.Counter)
    examples: dict[str, list[dict[str, Any]]] = field(default_factory=lambda: collections.defaultdict(list))
    latencies: list[float] = field(default_factory=list)

    def fail(self, kind: str, case: Case | None, detail: str) -> None:
        self.failures[kind] += 1
        if len(self.examples[kind]) < 5:
            self.examples[kind].append({"case": case.kind if case else None,
                                        "request": case.raw[:400].decode("latin-1") if case else None,
                                        "detail": detail[:600]})

    def note(self, what: str, case: Case, detail: str) -> None:
        """Count something that is not a failure, keeping a few examples."""
        self.info[what] += 1
        if len(self.examples[what]) < 3:
            self.examples[what].append({"case": case.kind, "request": case.raw[:300].decode("latin-1"),
                                        "detail": detail[:300]})

    def to_json(self) -> dict[str, Any]:
        lat = sorted(self.latencies)
        pct = {f"p{p}": round(lat[min(len(lat) - 1, int(len(lat) * p / 100))] * 1000, 2) for p in (50, 99)} \
            if lat else {}
        return {"sent": self.sent, "failures": dict(self.failures), "info": dict(self.info),
                "by_kind_status": {k: dict(v) for k, v in sorted(self.by_kind_status.items())},
                "latency_ms": pct, "examples": dict(self.examples)}


# --- exchange ------------------------------------------------------------------------------


def _parser(method: str) -> h11.Connection:
    """An h11 client primed as if it had sent a request with this method (we send our own
    bytes), so that it frames the reply (HEAD: no body)."""
    conn = h11.Connection(h11.CLIENT, max_incomplete_event_size=1 << 20)
    conn.send(h11.Request(method="HEAD" if method == "HEAD" else "POST", target="/",
                          headers=[("host", "x"), ("content-length", "0")]))
    conn.send(h11.EndOfMessage())
    return conn


async def _read_reply(reader: asyncio.StreamReader, conn: h11.Connection, deadline: float) -> Reply:
    r = Reply()
    body = bytearray()
    eof = False
    received = 0
    while True:
        try:
            ev = conn.next_event()
        except h11.RemoteProtocolError as e:
            # EOF before a reply started is a plain close; anything else is a broken reply
            r.error = "closed" if eof and not received else f"malformed: {e}"
            return r
        if ev is h11.NEED_DATA:
            try:
                data = await asyncio.wait_for(reader.read(65536), max(0.001, deadline - time.monotonic()))
            except (ConnectionError, OSError) as e:
                data = b""
                r.error = f"reset: {e.__class__.__name__}"
            eof = not data
            received += len(data)
            conn.receive_data(data)
            continue
        if isinstance(ev, h11.InformationalResponse):
            continue
        if isinstance(ev, h11.Response):
            r.status = ev.status_code
            r.headers = {k.lower(): v for k, v in ev.headers}
        elif isinstance(ev, h11.Data):
            body += ev.data
        elif isinstance(ev, h11.EndOfMessage):
            r.body, r.complete = bytes(body), True
            return r
        elif isinstance(ev, h11.ConnectionClosed):
            r.body = bytes(body)
            if not r.error:
                r.error = "closed"
            return r


FOLLOW_REQUEST = http_request(b"POST", CHAT.encode(), dumps(valid_body(CHAT)))


async def exchange(host: str, port: int, case: Case, rid: str, timeout: float) -> tuple[Reply, Reply | None]:
    """Send the case (and the valid follow-up, if any); raise TimeoutError on a hang."""
    deadline = time.monotonic() + timeout
    reader, writer = await asyncio.wait_for(asyncio.open_connection(host, port), timeout)
    follow_raw = FOLLOW_REQUEST.replace(RID_MARK, f"x-request-id: {rid}-f\r\n".encode(), 1)
    try:
        sock = writer.get_extra_info("socket")
        if sock is not None:
            sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        try:
            writer.write(case.wire(rid) + (follow_raw if case.follow_up == 2 else b""))
            await asyncio.wait_for(writer.drain(), timeout)
            if not case.strict and not case.abort_after:
                writer.write_eof()  # a loose case: the answer (or the close) must come now
        except (ConnectionError, OSError):
            pass  # refused early (e.g. 413 before the whole body): read what was answered
        if case.abort_after:
            await asyncio.wait_for(reader.read(case.abort_after), timeout)
            return Reply(status=0, complete=True), None
        conn = _parser(case.method)
        first = await _read_reply(reader, conn, deadline)
        follow = None
        if case.follow_up and first.complete and conn.our_state is h11.DONE and conn.their_state is h11.DONE:
            conn.start_next_cycle()
            conn.send(h11.Request(method="POST", target="/", headers=[("host", "x"), ("content-length", "0")]))
            conn.send(h11.EndOfMessage())
            try:
                if case.follow_up == 1:
                    writer.write(follow_raw)
                    await asyncio.wait_for(writer.drain(), timeout)
                follow = await _read_reply(reader, conn, deadline)
            except (ConnectionError, OSError) as e:
                follow = Reply(error=f"reset: {e.__class__.__name__}")
        return first, follow
    finally:
        writer.close()


# --- checks --------------------------------------------------------------------------------


def openai_error_problem(reply: Reply) -> str | None:
    """None if the reply body is an OpenAI-style error, else what is wrong."""
    if not reply.headers.get(b"content-type", b"").startswith(b"application/json"):
        return f"content-type {reply.headers.get(b'content-type')!r}"
    try:
        obj = json.loads(reply.body)
    except ValueError:
        return "body is not JSON"
    if not isinstance(obj, dict) or set(obj) != {"error"} or not isinstance(obj["error"], dict):
        return "not {'error': {...}}"
    err = obj["error"]
    if set(err) != {"message", "type", "param", "code"} or not isinstance(err["message"], str) \
            or not err["message"] or not isinstance(err["type"], str):
        return f"error fields {sorted(err)}"
    return None


def stream_problem(body: bytes) -> str | None:
    events = [line[5:].strip() for line in body.split(b"\n") if line.startswith(b"data:")]
    if any(e.startswith(b"{\"error\"") for e in events):
        return "error event in the stream"
    if not events or events[-1] != b"[DONE]":
        return f"no [DONE] at the end: {events[-2:]!r}"
    return None


def leak_problem(body: bytes, engine_ports: set[int]) -> str | None:
    if b"Traceback" in body or b'File "/' in body:
        return "traceback"
    for m in _ADDR.finditer(body):
        if int(m.group(1) or m.group(2)) in engine_ports:
            return f"backend address {m.group(0)!r}"
    return None


def check(case: Case, reply: Reply, follow: Reply | None, engine_ports: set[int]) -> list[tuple[str, str]]:
    """The invariant violations of one exchange, as (kind, detail); 5xx are checked by the
    caller (they need the simulator's log)."""
    out: list[tuple[str, str]] = []
    if reply.status is None:
        if case.strict:
            out.append(("no_response", reply.error))
        return out
    if reply.error.startswith("malformed"):
        out.append(("malformed_response", reply.error))
    leak = leak_problem(reply.body, engine_ports)
    if leak:
        out.append(("leak", leak))
    ctype = reply.headers.get(b"content-type", b"")
    if case.strict and reply.status >= 400 and case.method != "HEAD":
        problem = openai_error_problem(reply)
        if problem:
            out.append(("non_openai_error", f"{reply.status}: {problem}: {reply.body[:200]!r}"))
    if reply.status == 200 and ctype.startswith(b"text/event-stream"):
        problem = stream_problem(reply.body) if reply.complete else f"incomplete stream ({reply.error})"
        if problem:
            out.append(("stream_error", problem))
    if follow is not None and follow.status is not None and follow.status != 200:
        out.append(("follow_up", f"{follow.status}: {follow.body[:200]!r}"))
    if follow is not None and follow.error.startswith("malformed"):
        out.append(("malformed_response", f"follow-up: {follow.error}"))
    return out


# --- the run -------------------------------------------------------------------------------


@dataclass
class Target:
    host: str
    port: int
    admin_url: str
    sim_admin_url: str
    engine_ports: set[int]


def _get(url: str, timeout: float = 10.0) -> tuple[int, bytes]:
    try:
        with urllib.request.urlopen(url, timeout=timeout) as r:
            return r.status, r.read()
    except urllib.error.HTTPError as e:
        return e.code, e.read()
    except OSError as e:
        return 0, str(e).encode()


def upstream_logged_5xx(t: Target, rid: str) -> bool:
    """Whether the simulator logged request `rid` with a 5xx (a relayed engine error)."""
    code, raw = _get(f"{t.sim_admin_url}/admin/engines/*/requests?limit=5000", timeout=60)
    if code != 200:
        return False
    for eng in json.loads(raw):
        for e in eng.get("log", []):
            if e.get("request_id") == rid and (e.get("http_status") or 0) >= 500:
                return True
    return False


def worker_pids(t: Target) -> list[int]:
    code, raw = _get(f"{t.admin_url}/debug/workers")
    return sorted(w["pid"] for w in json.loads(raw)["workers"]) if code == 200 else []


def health_problem(t: Target, router: Child | None, pids: list[int]) -> str | None:
    if router is not None and not router.alive():
        return f"router exited with status {router.proc.returncode}"
    code, _ = _get(f"{t.admin_url}/readyz")
    if code != 200:
        return f"/readyz {code}"
    now = worker_pids(t)
    if pids and now != pids:
        return f"worker processes changed: {pids} -> {now}"
    return None


async def run_batch(t: Target, cases: list[Case], first_index: int, seed: int, args: argparse.Namespace,
                    rep: Report) -> None:
    queue: asyncio.Queue[tuple[int, Case]] = asyncio.Queue()
    for i, c in enumerate(cases):
        queue.put_nowait((first_index + i, c))

    async def worker() -> None:
        while not queue.empty():
            i, case = queue.get_nowait()
            rid = f"fz-{seed}-{i}"
            t0 = time.perf_counter()
            try:
                reply, follow = await exchange(t.host, t.port, case, rid, args.timeout)
            except (TimeoutError, asyncio.TimeoutError):
                rep.sent += 1
                rep.by_kind_status[case.kind]["timeout"] += 1
                rep.fail("hang", case, f"no reply or close within {args.timeout}s")
                continue
            except (ConnectionError, OSError) as e:
                rep.sent += 1
                rep.by_kind_status[case.kind]["connect_error"] += 1
                rep.fail("no_response", case, f"connect: {e!r}")
                continue
            rep.latencies.append(time.perf_counter() - t0)
            rep.sent += 1
            status = "client went away" if case.abort_after else str(reply.status) if reply.status is not None \
                else f"no reply ({reply.error.split(':')[0]})"
            rep.by_kind_status[case.kind][status] += 1
            if not case.strict and reply.status is not None and reply.status >= 400 \
                    and openai_error_problem(reply):
                rep.note(f"loose case refused by the HTTP layer ({reply.status}, not JSON)", case,
                         repr(reply.body[:200]))
            if reply.status is not None and 300 <= reply.status < 400:
                rep.note(f"redirect {reply.status}", case, repr(reply.headers.get(b"location")))
            if follow is not None and follow.status is None:
                rep.info["follow-up: connection closed by the router"] += 1
            for kind, detail in check(case, reply, follow, t.engine_ports):
                rep.fail(kind, case, detail)
            for r, id_ in ((reply, rid), (follow, rid + "-f")):
                if r is not None and r.status is not None and r.status >= 500:
                    upstream = await asyncio.to_thread(upstream_logged_5xx, t, id_)
                    rep.fail("upstream_5xx" if upstream else "router_5xx", case,
                             f"{r.status}: {r.body[:300]!r}")

    await asyncio.gather(*(worker() for _ in range(args.concurrency)))


def final_request(t: Target) -> str | None:
    body = dumps(valid_body(CHAT, max_tokens=2))
    req = urllib.request.Request(f"http://{t.host}:{t.port}{CHAT}", data=body,
                                 headers={"content-type": "application/json"})
    try:
        with urllib.request.urlopen(req, timeout=30) as r:
            obj = json.loads(r.read())
            return None if r.status == 200 and obj.get("choices") else f"{r.status}: {obj}"
    except (OSError, ValueError) as e:
        return repr(e)


def fuzz(t: Target, router: Child | None, args: argparse.Namespace) -> Report:
    rep = Report()
    pids = worker_pids(t)
    gen_s = send_s = 0.0
    done = 0
    while done < args.requests:
        n = min(args.batch, args.requests - done)
        g0 = time.perf_counter()
        cases = generate(n, args.seed * 1_000_003 + done)
        g1 = time.perf_counter()
        asyncio.run(run_batch(t, cases, done, args.seed, args, rep))
        send_s += time.perf_counter() - g1
        gen_s += g1 - g0
        done += n
        if router is not None:  # our simulator: bound its request log
            urllib.request.urlopen(urllib.request.Request(
                f"{t.sim_admin_url}/admin/engines/*/requests/reset", method="POST"), timeout=30).close()
        problem = health_problem(t, router, pids)
        if problem:
            rep.fail("crash", None, f"after {done} requests: {problem}")
            break
        if args.progress:
            print(f"fuzz: {done}/{args.requests} sent, violations {dict(rep.failures)}, "
                  f"{done / send_s:.0f} req/s while sending", file=sys.stderr, flush=True)
    problem = final_request(t)
    if problem:
        rep.fail("final_request", None, problem)
    rep.info["generate_s"] = round(gen_s, 1)  # type: ignore[assignment]
    rep.info["send_s"] = round(send_s, 1)  # type: ignore[assignment]
    return rep


def start(args: argparse.Namespace, tmp: Path) -> tuple[Target, list[Child]]:
    stop = threading.Event()
    sim = Child("simulator", [
        sys.executable, "-m", "loadtest.simulator", "--engines", "3", "--host", HOST, "--ports", "0,0,0",
        "--admin-port", "0", "--model", "demo", "--lora", "demo-lora-a", "--lora", "demo-lora-b",
        "--fast", "--fast-ttft-ms", "1", "--fast-itl-ms", "0",
    ], capture_stdout=True)
    children = [sim]
    ready = wait_simulator_ready(sim, stop)
    port, admin = free_ports(2)
    config = demo_config(DEFAULT_CONFIG, list(ready["ports"]), tmp)
    router = Child("router", [
        sys.executable, "-m", "kthena_router.cli", "--config", str(config), "--host", HOST, "--port", str(port),
        "--admin-host", HOST, "--admin-port", str(admin), "--workers", str(args.workers),
        "--max-body-bytes", str(MAX_BODY_BYTES), *(["--router-config", str(ROUTER_CONFIG)]
                                                   if args.scheduling == "prefix-cache" else []),
        "--drain-grace-s", "2", "--log-level", "error",
    ])
    children.insert(0, router)
    wait_router_ready(router, admin, stop)
    target = Target(HOST, port, f"http://{HOST}:{admin}", f"http://{HOST}:{ready['admin_port']}",
                    set(ready["ports"]))
    return target, children


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    p = argparse.ArgumentParser(prog="python -m loadtest.fuzz_router", description=__doc__.split("\n")[0])
    p.add_argument("--requests", type=int, default=2000)
    p.add_argument("--seed", type=int, default=1)
    p.add_argument("--concurrency", type=int, default=12, help="connections in flight")
    p.add_argument("--timeout", type=float, default=30.0, help="per exchange, seconds")
    p.add_argument("--batch", type=int, default=2000, help="cases generated, then sent, at a time")
    p.add_argument("--workers", type=int, default=2, help="router workers (when started here)")
    p.add_argument("--scheduling", choices=["prefix-cache", "none"], default="prefix-cache",
                   help="router started here: prefix-cache.yaml (Python decides every completion), or no "
                        "router configuration (round-robin: the Rust front decides plain routes itself)")
    p.add_argument("--router", help="host:port of a running router (else one is started)")
    p.add_argument("--router-admin", help="its admin URL, e.g. http://127.0.0.1:15000")
    p.add_argument("--sim-admin", help="the simulator's admin URL")
    p.add_argument("--engine-ports", default="", help="the engines' ports (leak check), comma-separated")
    p.add_argument("--report", help="write the JSON report here")
    p.add_argument("--progress", action="store_true", help="a line per batch on stderr")
    return p.parse_args(argv)


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    children: list[Child] = []
    t0 = time.perf_counter()
    with tempfile.TemporaryDirectory(prefix="kthena-fuzz-") as tmp:
        try:
            if args.router:
                host, _, port = args.router.rpartition(":")
                target = Target(host, int(port), args.router_admin, args.sim_admin,
                                {int(p) for p in args.engine_ports.split(",") if p})
            else:
                target, children = start(args, Path(tmp))
            rep = fuzz(target, children[0] if children else None, args)
        finally:
            for c in children:
                c.stop(20.0)
    out = rep.to_json()
    out["wall_s"] = round(time.perf_counter() - t0, 1)
    out["seed"] = args.seed
    out["concurrency"] = args.concurrency
    text = json.dumps(out, indent=1, default=str)
    if args.report:
        Path(args.report).write_text(text)
    print(text)
    return 1 if rep.failures else 0


if __name__ == "__main__":
    sys.exit(main())
