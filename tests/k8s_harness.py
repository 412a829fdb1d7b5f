"""A real Kubernetes control plane for tests: etcd, kube-apiserver, kube-controller-manager.

The binaries come from scripts/k8s-testbin.sh (built from Go modules, cached under
~/.cache). No kubelet and no scheduler: tests create pods and patch their status
themselves (docs/kubernetes-testing.md). Every process is started here and stopped here.
"""

from __future__ import annotations

import os
import secrets
import ssl
import subprocess
import tempfile
from pathlib import Path
from typing import Any

import httpx
import yaml
from cryptography.hazmat.primitives import serialization
from cryptography.hazmat.primitives.asymmetric import rsa

import harness

REPO = Path(__file__).resolve().parent.parent
TESTBIN_SCRIPT = REPO / "scripts" / "k8s-testbin.sh"
SERVICE_CIDR = "10.0.0.0/24"


class TestbinUnavailable(RuntimeError):
    """The control-plane binaries could not be built (a failure, never a skip)."""


def testbin_dir() -> Path:
    """Build (or find cached) binaries; the script prints their directory last."""
    proc = subprocess.run(["bash", str(TESTBIN_SCRIPT)], capture_output=True, text=True, timeout=3600)
    if proc.returncode != 0:
        raise TestbinUnavailable(f"scripts/k8s-testbin.sh failed (exit {proc.returncode}); the Kubernetes "
                                 f"tests need its binaries:\n{proc.stderr[-4000:]}")
    return Path(proc.stdout.strip().splitlines()[-1])


def _rsa_pair(directory: Path) -> tuple[Path, Path]:
    key = rsa.generate_private_key(public_exponent=65537, key_size=2048)
    priv = directory / "sa.key"
    pub = directory / "sa.pub"
    priv.write_bytes(key.private_bytes(serialization.Encoding.PEM, serialization.PrivateFormat.TraditionalOpenSSL,
                                       serialization.NoEncryption()))
    pub.write_bytes(key.public_key().public_bytes(serialization.Encoding.PEM,
                                                  serialization.PublicFormat.SubjectPublicKeyInfo))
    return priv, pub


class ControlPlane:
    """etcd (data on tmpfs) + kube-apiserver (+ kube-controller-manager) on free loopback ports."""

    def __init__(self, bin_dir: Path, work: Path, controller_manager: bool = True) -> None:
        self.bin = bin_dir
        self.work = work
        self.with_kcm = controller_manager
        self.volcano = False  # Volcano's PodGroup/Queue CRDs installed (tests/k8s/volcano_crds.py)
        self.token = secrets.token_hex(16)
        self.etcd: harness.ManagedProcess | None = None
        self.apiserver: harness.ManagedProcess | None = None
        self.kcm: harness.ManagedProcess | None = None
        self.etcd_port, self.peer_port, self.port, self.kcm_port = harness.free_ports(4)
        shm = Path("/dev/shm") if Path("/dev/shm").is_dir() else None
        self._etcd_dir = tempfile.mkdtemp(prefix="kthena-etcd-", dir=shm)
        self.cert_dir = work / "apiserver-certs"
        self.cert_dir.mkdir(parents=True, exist_ok=True)
        self.kubeconfig = work / "kubeconfig"

    @property
    def url(self) -> str:
        return f"https://{harness.HOST}:{self.port}"

    # --- lifecycle -------------------------------------------------------------------------
    def start(self) -> ControlPlane:
        self._start_etcd()
        self._start_apiserver()
        self._write_kubeconfig()
        if self.with_kcm:
            self._start_kcm()
        return self

    def _start_etcd(self) -> None:
        client = f"http://{harness.HOST}:{self.etcd_port}"
        self.etcd = harness.ManagedProcess("etcd", [
            str(self.bin / "etcd"), "--data-dir", self._etcd_dir, "--name", "test",
            "--listen-client-urls", client, "--advertise-client-urls", client,
            "--listen-peer-urls", f"http://{harness.HOST}:{self.peer_port}",
            "--initial-advertise-peer-urls", f"http://{harness.HOST}:{self.peer_port}",
            "--initial-cluster", f"test=http://{harness.HOST}:{self.peer_port}",
            "--unsafe-no-fsync", "--log-level", "warn"], self.work)
        harness.wait_until(lambda: self._etcd_healthy(), 60, interval=0.2, what="etcd healthy")

    def _etcd_healthy(self) -> bool:
        assert self.etcd is not None
        if not self.etcd.alive():
            raise RuntimeError(f"etcd exited:\n{self.etcd.tail()}")
        try:
            return httpx.get(f"http://{harness.HOST}:{self.etcd_port}/health", timeout=1).json().get("health") == "true"
        except (httpx.HTTPError, ValueError):
            return False

    def _start_apiserver(self) -> None:
        tokens = self.work / "tokens.csv"
        tokens.write_text(f'{self.token},admin,admin,"system:masters"\n')
        priv, pub = _rsa_pair(self.work)
        self.apiserver = harness.ManagedProcess("kube-apiserver", [
            str(self.bin / "kube-apiserver"),
            "--etcd-servers", f"http://{harness.HOST}:{self.etcd_port}",
            "--secure-port", str(self.port), "--bind-address", harness.HOST,
            "--advertise-address", harness.HOST,
            "--service-cluster-ip-range", SERVICE_CIDR,
            "--authorization-mode", "RBAC",
            "--token-auth-file", str(tokens),
            "--cert-dir", str(self.cert_dir),
            "--service-account-issuer", f"https://{harness.HOST}:{self.port}",
            "--service-account-key-file", str(pub),
            "--service-account-signing-key-file", str(priv),
            "--disable-admission-plugins", "ServiceAccount",
            "--enable-priority-and-fairness=false",
            "--v", "1"], self.work)
        harness.wait_until(lambda: self._ready(), 120, interval=0.25, what="kube-apiserver /readyz")

    def _ready(self) -> bool:
        assert self.apiserver is not None
        if not self.apiserver.alive():
            raise RuntimeError(f"kube-apiserver exited:\n{self.apiserver.tail()}")
        try:
            r = httpx.get(f"{self.url}/readyz", headers=self.auth_headers, verify=False, timeout=2)
        except httpx.HTTPError:
            return False
        return r.status_code == 200

    def _write_kubeconfig(self) -> None:
        ca = self.cert_dir / "apiserver.crt"  # self-signed serving cert: its own CA
        cfg = {
            "apiVersion": "v1", "kind": "Config", "current-context": "test",
            "clusters": [{"name": "test", "cluster": {"server": self.url, "certificate-authority": str(ca)}}],
            "users": [{"name": "admin", "user": {"token": self.token}}],
            "contexts": [{"name": "test", "context": {"cluster": "test", "user": "admin", "namespace": "default"}}],
        }
        self.kubeconfig.write_text(yaml.safe_dump(cfg))

    def _start_kcm(self) -> None:
        self.kcm = harness.ManagedProcess("kube-controller-manager", [
            str(self.bin / "kube-controller-manager"), "--kubeconfig", str(self.kubeconfig),
            "--authentication-kubeconfig", str(self.kubeconfig), "--authorization-kubeconfig", str(self.kubeconfig),
            "--secure-port", str(self.kcm_port), "--bind-address", harness.HOST,
            "--leader-elect=false", "--controllers", "garbagecollector,namespace",
            "--v", "1"], self.work)

    def kill_apiserver(self) -> None:
        if self.apiserver is not None:
            self.apiserver.stop()

    def restart_apiserver(self) -> None:
        self.kill_apiserver()
        self._start_apiserver()

    def stop(self) -> None:
        for proc in (self.kcm, self.apiserver, self.etcd):
            if proc is not None:
                proc.stop()
        subprocess.run(["rm", "-rf", self._etcd_dir], check=False)

    # --- client helpers --------------------------------------------------------------------
    @property
    def auth_headers(self) -> dict[str, str]:
        return {"Authorization": f"Bearer {self.token}"}

    def ssl_context(self) -> ssl.SSLContext:
        return ssl.create_default_context(cafile=str(self.cert_dir / "apiserver.crt"))

    def client(self) -> httpx.Client:
        return httpx.Client(base_url=self.url, headers=self.auth_headers, verify=self.ssl_context(), timeout=30)

    def kubectl(self, *args: str, input: str | None = None, check: bool = True) -> subprocess.CompletedProcess[str]:
        env = {**os.environ, "KUBECONFIG": str(self.kubeconfig)}
        proc = subprocess.run([str(self.bin / "kubectl"), *args], input=input, capture_output=True, text=True,
                              env=env, timeout=120)
        if check and proc.returncode != 0:
            raise RuntimeError(f"kubectl {' '.join(args)} failed ({proc.returncode}):\n{proc.stderr}")
        return proc

    def apply(self, docs: list[dict[str, Any]] | str, *args: str) -> subprocess.CompletedProcess[str]:
        text = docs if isinstance(docs, str) else yaml.safe_dump_all(docs)
        return self.kubectl("apply", "--server-side", "--field-manager", "tests", "-f", "-", *args, input=text)
