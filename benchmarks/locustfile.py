"""Clients of an RL loop against `harness serve`: each submits level2/62 attempts one after another and polls the
ones it got accepted. Driven by benchmarks/service_load.py (and the CI-sized test), which start the server and
read what this file records; by hand:

    locust -f benchmarks/locustfile.py --headless -u 64 -r 64 -t 60s -H http://127.0.0.1:8000

The attempts are what an RL loop sends, each text unique (a marker comment): the problem's Model as ModelNew,
alone or fenced in a reply (pure PyTorch, so a CPU worker evaluates it), and replies cut off before their code
(invalid_submission). A CUDA attempt is left out: with no GPU worker it would wait in the queue for good.

KH_LOAD_RECORD=<file>: every request (endpoint, status, seconds) and every accepted submission (marker, id) as
JSON lines, written when the run stops; the driver computes its percentiles from these, not from locust's
rounded histograms. KH_LOAD_WAIT_S: the pause between one client's requests (0: none).
"""

from __future__ import annotations

import json
import os
import random
import threading
import uuid
from pathlib import Path

from locust import FastHttpUser, constant, events, task

_PROBLEM_FILE = (Path(__file__).resolve().parents[1] / "harness" / "problems" / "kernelbench" / "level2"
                 / "62_Matmul_GroupNorm_LeakyReLU_Sum.py")
_SOURCE = _PROBLEM_FILE.read_text().replace("class Model(", "class ModelNew(")
_RUN = uuid.uuid4().hex[:8]

_requests: list[tuple[str, int, float]] = []
_accepted: list[tuple[str, int]] = []
_lock = threading.Lock()


def attempt_text(marker: str, rng: random.Random) -> tuple[str, str]:
    """(field, text) of one attempt: 'source' or 'reply', as the API takes them."""
    tagged = f"# attempt {marker}\n{_SOURCE}"
    kind = rng.random()
    if kind < 0.5:
        return "source", tagged
    if kind < 0.85:
        return "reply", f"The fused version keeps the ops in PyTorch for now.\n\n```python\n{tagged}\n```\n"
    return "reply", f"Attempt {marker}. I will fuse the matmul with the GroupNorm.\n\n```python\nimport torch\n"


@events.request.add_listener
def _record(name: str, response_time: float, response: object = None, exception: object = None, **_: object
            ) -> None:
    status = getattr(response, "status_code", 0) or 0
    with _lock:
        _requests.append((name, int(status), response_time / 1000))


@events.quitting.add_listener
def _write(**_: object) -> None:
    path = os.environ.get("KH_LOAD_RECORD")
    if not path:
        return
    with open(path, "w") as f:
        for name, status, seconds in _requests:
            f.write(json.dumps({"endpoint": name, "status": status, "s": round(seconds, 6)}) + "\n")
        for marker, sid in _accepted:
            f.write(json.dumps({"accepted": sid, "marker": marker}) + "\n")


class RLClient(FastHttpUser):
    wait_time = constant(float(os.environ.get("KH_LOAD_WAIT_S", "0")))
    network_timeout = 60.0
    connection_timeout = 60.0

    def on_start(self) -> None:
        self.rng = random.Random()  # noqa: S311 - picks attempts, not secrets
        self.mine: list[int] = []
        self.n = 0

    @task(4)
    def submit(self) -> None:
        self.n += 1
        marker = f"{_RUN}-{id(self):x}-{self.n}"
        field, text = attempt_text(marker, self.rng)
        body = {"problem": "level2/62", "submitter": f"rl-{id(self) % 997}", "model": "policy", field: text}
        with self.client.post("/api/submissions", json=body, name="submit", catch_response=True) as r:
            if r.status_code == 202:
                sid = r.json()["id"]
                self.mine.append(sid)
                with _lock:
                    _accepted.append((marker, sid))
                r.success()
            elif r.status_code == 429:
                r.success()  # the queue limit: an answer, counted apart by its status
            else:
                r.failure(f"{r.status_code}: {r.text[:200]}")

    @task(1)
    def poll(self) -> None:
        if self.mine:
            self.client.get(f"/api/submissions/{self.rng.choice(self.mine[-20:])}", name="poll")
