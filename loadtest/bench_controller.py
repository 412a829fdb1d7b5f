"""ModelServing controller benchmark: time and API calls to reconcile a large ModelServing.

Starts a real control plane (tests/k8s_harness.ControlPlane: etcd + kube-apiserver, no
kube-controller-manager, so the only API clients are the controller and this script) and the
controller as a real process (python -m controller), then:

1. create: a ModelServing of --groups ServingGroups x --roles roles x (1 entry + --workers)
   pods (default 100 x 2 x 4 = 800 pods, 200 headless Services); timed from the POST to
   the moment every pod exists (the controller's own write counter, then one LIST to check)
   and to the status reporting every group;
2. --rolling-update (optional): every pod is marked Ready, then the template changes; this
   script acts as the kubelet (a watch marks each new pod Running and Ready) until every pod
   carries modelserving.volcano.sh/revision == status.updateRevision and
   status.updatedReplicas == replicas (--max-unavailable: the rollout's maxUnavailable).
--volcano installs Volcano's CRDs first (a PodGroup per ServingGroup).

API calls: apiserver_request_total from the apiserver's own /metrics, before and after each
phase, by verb and resource, minus this script's own requests (counted client-side), so what
is left is the controller's (plus the apiserver's own lease renewals, shown under leases);
and the controller's kthena_controller_api_writes_total. Both are compared to the minimum
number of writes (creates of every pod and Service, status writes; rolling update: a delete
and a create per pod).

This script imports the test harness from tests/ (tests/k8s_harness.py, tests/k8s_crds.py)
through a sys.path insert: the control plane is the one the tests use.

    python -m loadtest.bench_controller [--groups 100] [--roles 2] [--workers 3]
        [--controller-workers 5] [--rolling-update] [--timeout 600] [--json PATH]
"""

from __future__ import annotations

import argparse
import json
import sys
import tempfile
import threading
import time
from collections import Counter
from pathlib import Path
from typing import Any

import httpx

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO / "tests"))  # the tests' control-plane harness (documented above)
sys.path.insert(0, str(REPO / "tests" / "k8s"))  # volcano_crds: Volcano's CRDs (configs/crds/volcano)

import harness  # noqa: E402
import k8s_crds  # noqa: E402
import k8s_harness  # noqa: E402
import volcano_crds  # noqa: E402

API = "workload.serving.volcano.sh/v1alpha1"
NS = "bench"
NAME = "bench"
REVISION = "modelserving.volcano.sh/revision"
Key = tuple[str, str]  # (verb, resource[/subresource])


# --- request accounting -----------------------------------------------------------------


def _resource(path: str) -> tuple[str, bool]:
    """('pods' | 'modelservings/status' | ..., names one object?) of an API path."""
    parts = path.split("?", 1)[0].strip("/").split("/")
    parts = parts[2:] if parts[0] == "api" else parts[3:]  # drop api/v1 or apis/<group>/<version>
    if parts and parts[0] == "namespaces" and len(parts) > 2:
        parts = parts[2:]
    res = parts[0] if parts else ""
    if len(parts) >= 3:
        res += "/" + parts[2]
    return res, len(parts) >= 2


class Counted:
    """An httpx client of the control plane that counts its own requests the way
    apiserver_request_total labels them."""

    def __init__(self, cp: k8s_harness.ControlPlane, share: Counted | None = None) -> None:
        """`share`: count into another client's tally (one per thread, one tally)."""
        self.calls: Counter[Key] = share.calls if share is not None else Counter()
        self._lock = share._lock if share is not None else threading.Lock()
        self.cp = cp
        self.http = httpx.Client(base_url=cp.url, headers=cp.auth_headers, verify=cp.ssl_context(),
                                 timeout=httpx.Timeout(30, read=None), event_hooks={"request": [self._count]})

    def _count(self, req: httpx.Request) -> None:
        res, named = _resource(req.url.path)
        verb = req.method
        if verb == "GET":
            verb = "WATCH" if req.url.params.get("watch") else ("GET" if named else "LIST")
        with self._lock:
            self.calls[(verb, res)] += 1

    def snapshot(self) -> Counter[Key]:
        with self._lock:
            return Counter(self.calls)


def apiserver_calls(c: Counted) -> Counter[Key]:
    """apiserver_request_total summed by (verb, resource[/subresource]) (this scrape counted too)."""
    text = c.http.get("/metrics").text
    out: Counter[Key] = Counter()
    for fam in harness.parse_metrics(text).values():
        for s in fam.samples:
            if s.name == "apiserver_request_total":
                res = s.labels.get("resource", "") + ("/" + s.labels["subresource"] if s.labels.get("subresource")
                                                      else "")
                out[(s.labels.get("verb", ""), res)] += int(s.value)
    return out


def controller_writes(port: int) -> Counter[Key]:
    fams = harness.parse_metrics(httpx.get(f"http://{harness.HOST}:{port}/metrics", timeout=10).text)
    out: Counter[Key] = Counter()
    for s in fams["kthena_controller_api_writes"].samples:
        if s.name == "kthena_controller_api_writes_total":
            out[(s.labels["verb"], s.labels["resource"])] += int(s.value)
    return out


def delta(after: Counter[Key], before: Counter[Key]) -> Counter[Key]:
    return Counter({k: after[k] - before[k] for k in after if after[k] - before[k] > 0})


# --- the workload -----------------------------------------------------------------------


def modelserving(groups: int, roles: int, workers: int, image: str, max_unavailable: str | None = None
                 ) -> dict[str, Any]:
    def tpl(img: str) -> dict[str, Any]:
        return {"spec": {"containers": [{"name": "engine", "image": img,
                                         "resources": {"requests": {"cpu": "1", "memory": "1Gi"}}}]}}
    spec: dict[str, Any] = {"replicas": groups, "template": {"roles": [
        {"name": f"role{r}", "replicas": 1, "workerReplicas": workers, "entryTemplate": tpl(image),
         "workerTemplate": tpl(image)} for r in range(roles)]}}
    if max_unavailable is not None:
        mu: int | str = int(max_unavailable) if max_unavailable.isdigit() else max_unavailable
        spec["rolloutStrategy"] = {"type": "ServingGroupRollingUpdate",
                                   "rollingUpdateConfiguration": {"maxUnavailable": mu}}
    return {"apiVersion": API, "kind": "ModelServing", "metadata": {"name": NAME, "namespace": NS}, "spec": spec}


def pod_names(c: Counted) -> dict[str, dict[str, Any]]:
    items = c.http.get(f"/api/v1/namespaces/{NS}/pods").json()["items"]
    return {p["metadata"]["name"]: p for p in items}


def set_ready(c: Counted, name: str) -> None:
    body = {"status": {"phase": "Running", "conditions": [{"type": "Ready", "status": "True"}]}}
    c.http.patch(f"/api/v1/namespaces/{NS}/pods/{name}/status", json=body,
                 headers={"Content-Type": "application/merge-patch+json"})


def ms_status(c: Counted) -> dict[str, Any]:
    return c.http.get(f"/apis/{API}/namespaces/{NS}/modelservings/{NAME}").json().get("status") or {}


class Kubelet(threading.Thread):
    """Marks every pod that appears (ADDED) Running and Ready, as a kubelet would. Its own
    client (counted with the script's); the server ends each watch after 2 s, so `finish()`
    joins the thread and the client is closed by the thread that reads it."""

    def __init__(self, cp: k8s_harness.ControlPlane, calls: Counted, rv: str) -> None:
        super().__init__(daemon=True)
        self.c = Counted(cp, calls)
        self.rv = rv
        self.stop = threading.Event()
        self.marked = 0

    def run(self) -> None:
        try:
            while not self.stop.is_set():
                try:
                    with self.c.http.stream("GET", f"/api/v1/namespaces/{NS}/pods",
                                            params={"watch": "1", "resourceVersion": self.rv,
                                                    "timeoutSeconds": "2"}) as resp:
                        for line in resp.iter_lines():
                            if not line:
                                continue
                            ev = json.loads(line)
                            if ev["type"] == "ERROR":
                                break
                            meta = ev["object"]["metadata"]
                            self.rv = meta["resourceVersion"]
                            if ev["type"] == "ADDED":
                                set_ready(self.c, meta["name"])
                                self.marked += 1
                except httpx.HTTPError:
                    pass
                self.stop.wait(0.1)
        finally:
            self.c.http.close()

    def finish(self) -> None:
        self.stop.set()
        self.join(40)


# --- phases -----------------------------------------------------------------------------


def phase(name: str, c: Counted, port: int, run: Any) -> dict[str, Any]:
    api0, own0, ctl0 = apiserver_calls(c), c.snapshot(), controller_writes(port)
    result = run()
    time.sleep(1.0)  # let in-flight status writes land before the "after" scrape
    ctl1, own1 = controller_writes(port), c.snapshot()
    api1 = apiserver_calls(c)
    own = Counter({k: v for k, v in delta(own1, own0).items() if k[1]})  # not /metrics scrapes
    api = delta(api1, api0)
    others = Counter({k: v - own.get(k, 0) for k, v in api.items() if k[1] and v - own.get(k, 0) > 0})
    result.update(name=name, controller_writes={f"{v} {r}": n for (v, r), n in sorted(delta(ctl1, ctl0).items())},
                  apiserver_other_calls={f"{v} {r}": n for (v, r), n in sorted(others.items())},
                  bench_calls={f"{v} {r}": n for (v, r), n in sorted(own.items())})
    return result


def create_phase(c: Counted, port: int, a: argparse.Namespace) -> dict[str, Any]:
    pods = a.groups * a.roles * (1 + a.workers)
    services = a.groups * a.roles if a.workers > 0 else 0
    t0 = time.monotonic()
    r = c.http.post(f"/apis/{API}/namespaces/{NS}/modelservings", json=modelserving(a.groups, a.roles, a.workers,
                                                                                    "engine:1", a.max_unavailable))
    assert r.status_code == 201, r.text
    harness.wait_until(lambda: controller_writes(port)[("create", "pods")] >= pods, a.timeout, interval=0.05,
                       what=f"{pods} pod creates")
    t_pods = time.monotonic() - t0
    harness.wait_until(lambda: ms_status(c).get("replicas") == a.groups, a.timeout, interval=0.2,
                       what="status.replicas")
    t_status = time.monotonic() - t0
    have = pod_names(c)
    assert len(have) == pods, f"{len(have)} pods, want {pods}"
    svc = c.http.get(f"/api/v1/namespaces/{NS}/services").json()["items"]
    assert len([s for s in svc if s["metadata"]["name"] != "kubernetes"]) == services
    return {"pods": pods, "services": services, "seconds_to_all_pods": round(t_pods, 2),
            "seconds_to_status": round(t_status, 2),
            "minimum_writes": {"create pods": pods, "create services": services, "create controllerrevisions": 1,
                               "update/patch status": 1,
                               **({"create podgroups": a.groups} if a.volcano else {})}}


def rolling_phase(c: Counted, port: int, a: argparse.Namespace) -> dict[str, Any]:
    pods = pod_names(c)
    for name in pods:  # every pod Ready before the update (not part of the measured calls' phase)
        set_ready(c, name)
    rv = c.http.get(f"/api/v1/namespaces/{NS}/pods", params={"limit": "1"}).json()["metadata"]["resourceVersion"]
    kubelet = Kubelet(c.cp, c, rv)
    kubelet.start()
    harness.wait_until(lambda: (ms_status(c).get("availableReplicas") == a.groups), a.timeout, interval=0.2,
                       what="all groups available")

    old_revision = ms_status(c).get("updateRevision")

    def run() -> dict[str, Any]:
        t0 = time.monotonic()
        patch = {"spec": {"template": {"roles": modelserving(a.groups, a.roles, a.workers, "engine:2", a.max_unavailable)["spec"]
                                       ["template"]["roles"]}}}
        r = c.http.patch(f"/apis/{API}/namespaces/{NS}/modelservings/{NAME}", json=patch,
                         headers={"Content-Type": "application/merge-patch+json"})
        assert r.status_code == 200, r.text
        generation = r.json()["metadata"]["generation"]

        def done() -> bool:
            st = ms_status(c)
            if st.get("observedGeneration", 0) < generation or st.get("updateRevision") == old_revision:
                return False  # the status still describes the old template
            if st.get("updatedReplicas") != a.groups:
                return False
            have = pod_names(c)
            return len(have) == len(pods) and all(p["metadata"]["labels"].get(REVISION) == st["updateRevision"]
                                                  for p in have.values())
        converged = True
        try:
            harness.wait_until(done, a.timeout, interval=0.5, what="rolling update")
        except TimeoutError:
            converged = False
        seconds = round(time.monotonic() - t0, 2)
        st = ms_status(c)
        updated = sum(1 for p in pod_names(c).values()
                      if p["metadata"]["labels"].get(REVISION) == st.get("updateRevision"))
        return {"converged": converged, "seconds": seconds, "updatedReplicas": st.get("updatedReplicas"),
                "pods_at_update_revision": updated, "kubelet_marked": kubelet.marked,
                "minimum_writes": {"delete pods": len(pods), "create pods": len(pods), "create controllerrevisions": 1,
                                   "update/patch status": 1}}
    try:
        return phase("rolling-update", c, port, run)
    finally:
        kubelet.finish()


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--groups", type=int, default=100)
    p.add_argument("--roles", type=int, default=2)
    p.add_argument("--workers", type=int, default=3, help="worker pods per role replica (plus the entry pod)")
    p.add_argument("--controller-workers", type=int, default=5)
    p.add_argument("--rolling-update", action="store_true",
                   help="also time a template change (a rolling update)")
    p.add_argument("--max-unavailable", help="rollingUpdateConfiguration.maxUnavailable (int or percent; "
                   "default: Kthena's, 1)")
    p.add_argument("--volcano", action="store_true", help="install Volcano's CRDs: a PodGroup per ServingGroup")
    p.add_argument("--timeout", type=float, default=600.0)
    p.add_argument("--json", type=Path, help="write the results here")
    a = p.parse_args(argv)

    work = Path(tempfile.mkdtemp(prefix="bench-controller-"))
    cp = k8s_harness.ControlPlane(k8s_harness.testbin_dir(), work, controller_manager=False).start()
    ctl = None
    c = Counted(cp)
    try:
        k8s_crds.install_crds(cp)
        if a.volcano:
            volcano_crds.install(cp)
        assert c.http.post("/api/v1/namespaces", json={"metadata": {"name": NS}}).status_code == 201
        port = harness.free_port()
        ctl = harness.ManagedProcess("controller", [
            harness.PYTHON, "-m", "controller", "--kubeconfig", str(cp.kubeconfig), "--namespace", NS,
            "--leader-elect-namespace", NS, "--workers", str(a.controller_workers),
            "--health-port", str(port), "--metrics-port", str(port)], work)
        harness.wait_until(lambda: harness.port_accepts(port) and
                           httpx.get(f"http://{harness.HOST}:{port}/readyz", timeout=5).text == "leader",
                           60, interval=0.1, what="controller leading")
        results = {"size": {"groups": a.groups, "roles": a.roles, "pods_per_role_replica": 1 + a.workers,
                            "controller_workers": a.controller_workers, "max_unavailable": a.max_unavailable,
                            "volcano": a.volcano},
                   "phases": [phase("create", c, port, lambda: create_phase(c, port, a))]}
        if a.rolling_update:
            results["phases"].append(rolling_phase(c, port, a))
        assert ctl.alive(), ctl.tail()
        print(json.dumps(results, indent=2))
        if a.json:
            a.json.write_text(json.dumps(results, indent=2) + "\n")
        return 0
    finally:
        if ctl is not None:
            ctl.stop()
        c.http.close()
        cp.stop()


if __name__ == "__main__":
    sys.exit(main())
