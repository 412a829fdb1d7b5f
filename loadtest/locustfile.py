"""Locust load for the OpenAI endpoint of the router (or any engine), streaming.

    make run    # in another terminal: simulator + router on 127.0.0.1:8080
    locust -f loadtest/locustfile.py --headless -u 10 -r 5 -t 30s --host http://127.0.0.1:8080

Four user classes (pick some by naming them after the options: `... ChatSharedPrefix`):
chat / completions x shared-prefix (prompts of a few groups sharing a long system
prompt, as loadtest/shared_prefix/workload.py builds them) / random (no shared prefix).
Each streamed request reports two entries: `POST <name>` (whole stream, E2E) and
`TTFT <name>` (time to the first content chunk), so both get percentiles.

Environment: LOCUST_MODEL (demo), LOCUST_MAX_TOKENS (32), LOCUST_PREFIX_TOKENS (1024),
LOCUST_QUESTION_TOKENS (64), LOCUST_GROUPS (8), LOCUST_SEED (1).
"""

from __future__ import annotations

import json
import os
import random
import sys
import time
from pathlib import Path
from typing import Any

import requests
from locust import User, between, task

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))  # locust adds loadtest/ only
from loadtest.shared_prefix.workload import words_text  # noqa: E402

MODEL = os.environ.get("LOCUST_MODEL", "demo")
MAX_TOKENS = int(os.environ.get("LOCUST_MAX_TOKENS", "32"))
PREFIX_TOKENS = int(os.environ.get("LOCUST_PREFIX_TOKENS", "1024"))
QUESTION_TOKENS = int(os.environ.get("LOCUST_QUESTION_TOKENS", "64"))
GROUPS = int(os.environ.get("LOCUST_GROUPS", "8"))
_rng = random.Random(int(os.environ.get("LOCUST_SEED", "1")))
SYSTEM_PROMPTS = [words_text(_rng, PREFIX_TOKENS) for _ in range(GROUPS)]
TIMEOUT_S = 120.0


class _OpenAIUser(User):
    """Streams one request per task with a plain requests.Session (loopback, no proxies),
    timing it itself so that TTFT and E2E are both reported."""

    abstract = True
    wait_time = between(0.1, 0.5)
    chat = True
    shared_prefix = True

    def on_start(self) -> None:
        self.session = requests.Session()
        self.session.trust_env = False
        self.rng = random.Random()

    def on_stop(self) -> None:
        self.session.close()

    def _prompt(self) -> tuple[str | None, str]:
        question = words_text(self.rng, QUESTION_TOKENS)
        if self.shared_prefix:
            return self.rng.choice(SYSTEM_PROMPTS), question
        return None, words_text(self.rng, PREFIX_TOKENS) + " " + question

    def _body(self) -> tuple[str, dict[str, Any]]:
        system, user = self._prompt()
        common = {"model": MODEL, "stream": True, "max_tokens": MAX_TOKENS}
        if self.chat:
            msgs = ([{"role": "system", "content": system}] if system else []) + [
                {"role": "user", "content": user}]
            return "/v1/chat/completions", {**common, "messages": msgs}
        prompt = f"{system}\n\n{user}" if system else user
        return "/v1/completions", {**common, "prompt": prompt}

    def _fire(self, kind: str, name: str, t0: float, t: float, length: int,
              exc: Exception | None) -> None:
        self.environment.events.request.fire(
            request_type=kind, name=name, response_time=(t - t0) * 1000.0,
            response_length=length, exception=exc, context={})

    @task
    def stream_one(self) -> None:
        path, body = self._body()
        name = f"{path} {'shared' if self.shared_prefix else 'random'}"
        t0 = time.perf_counter()
        t_first: float | None = None
        length, exc, done = 0, None, False
        try:
            with self.session.post(self.host + path, json=body, stream=True,
                                   timeout=TIMEOUT_S) as r:
                if r.status_code != 200:
                    raise RuntimeError(f"HTTP {r.status_code}: {r.text[:200]}")
                for line in r.iter_lines():
                    if not line.startswith(b"data:"):
                        continue
                    length += len(line)
                    data = line[5:].strip()
                    if data == b"[DONE]":
                        done = True
                        break
                    if t_first is None and _has_text(json.loads(data)):
                        t_first = time.perf_counter()
            if not done:
                raise RuntimeError("stream ended without [DONE]")
        except Exception as e:  # noqa: BLE001 - every failure is a failed sample
            exc = e
        t_end = time.perf_counter()
        if t_first is not None:
            self._fire("TTFT", name, t0, t_first, 0, None)
        self._fire("POST", name, t0, t_end, length, exc)


def _has_text(chunk: dict[str, Any]) -> bool:
    for c in chunk.get("choices") or ():
        if (c.get("delta") or {}).get("content") or c.get("text"):
            return True
    return False


class ChatSharedPrefix(_OpenAIUser):
    weight = 3


class ChatRandom(_OpenAIUser):
    weight = 1
    shared_prefix = False


class CompletionSharedPrefix(_OpenAIUser):
    weight = 1
    chat = False


class CompletionRandom(_OpenAIUser):
    weight = 1
    chat = False
    shared_prefix = False
