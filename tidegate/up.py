"""`tidegate up`: the whole stack on one machine, supervised.

Backend replicas and the gateway run as child processes of this one. A replica that crashes is restarted with
exponential backoff; Ctrl-C (or SIGTERM) stops everything cleanly. The admin key and a bootstrap API key are
kept in the data dir (mode 0600), so a restart keeps the same credentials and loses no accounts, keys or usage.
A key is printed only when it is created (or with --show-keys): logs of later starts name its file instead.
"""

from __future__ import annotations

import argparse
import json
import os
import signal
import subprocess
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path

import httpx
import yaml

from config import Settings
from tidegate.processes import stop_process
from tidegate.secret_files import new_admin_key, secret_file, write_secret

BACKOFF_MAX = 30.0
STABLE_AFTER = 60.0  # a child that has lived this long gets its backoff reset
REPLICA_PREFIX = "backend-"  # the channels `tidegate up` owns in the store


@dataclass(slots=True)
class Child:
    name: str
    argv: list[str]
    health_url: str
    log_path: Path
    proc: subprocess.Popen[bytes] | None = None
    started_at: float = 0.0
    backoff: float = 1.0
    restart_at: float | None = None
    restarts: int = field(default=0)

    def start(self) -> None:
        log = self.log_path.open("ab")
        self.proc = subprocess.Popen(self.argv, stdout=log, stderr=subprocess.STDOUT, start_new_session=True)
        log.close()
        self.started_at = time.monotonic()
        self.restart_at = None
        print(f"started {self.name} (pid {self.proc.pid}); log {self.log_path}", flush=True)

    def alive(self) -> bool:
        return self.proc is not None and self.proc.poll() is None

    def stop(self, timeout: float = 10.0) -> None:
        stop_process(self.proc, timeout)


def _tidegate(*args: str) -> list[str]:
    return [sys.executable, "-m", "tidegate", *args]


def _wait_healthy(children: list[Child], timeout: float) -> None:
    deadline = time.monotonic() + timeout
    pending = list(children)
    while pending:
        if time.monotonic() > deadline:
            names = ", ".join(c.name for c in pending)
            raise RuntimeError(f"not healthy after {timeout:.0f}s: {names} (see logs in {pending[0].log_path.parent})")
        for child in list(pending):
            if not child.alive():
                raise RuntimeError(f"{child.name} exited at start; its log: {child.log_path}")
            try:
                if httpx.get(child.health_url, timeout=1.0).status_code == 200:
                    pending.remove(child)
            except httpx.HTTPError:
                pass
        time.sleep(0.2)


def bootstrap_api_key(base_url: str, admin_key: str, key_file: Path) -> tuple[str, bool]:
    """Reuse the stored bootstrap key while it still works; otherwise create account `local` and a key.
    Returns the key and whether it was created now."""
    if key_file.exists():
        secret = key_file.read_text().strip()
        if httpx.get(f"{base_url}/v1/models", headers={"Authorization": f"Bearer {secret}"}).status_code == 200:
            return secret, False
    admin = {"Authorization": f"Bearer {admin_key}"}
    accounts = httpx.get(f"{base_url}/admin/accounts", headers=admin, timeout=10).json()
    rows = accounts.get("data", accounts) if isinstance(accounts, dict) else accounts
    account = next((a for a in rows if a.get("name") == "local"), None)
    if account is None:
        account = httpx.post(f"{base_url}/admin/accounts", headers=admin, json={"name": "local"}, timeout=10).json()
    created = httpx.post(f"{base_url}/admin/keys", headers=admin, timeout=10,
                         json={"account_id": account["id"], "name": "tidegate-up"})
    created.raise_for_status()
    secret = str(created.json()["key"])
    write_secret(key_file, secret)
    return secret, True


def register_replicas(base_url: str, admin_key: str, backends: list[Child], served: str) -> None:
    """Adds (or points again) a channel per backend replica, and drains those of replicas this run does not have:
    the store keeps channels across runs, and a run with fewer replicas must not route to the missing ones."""
    admin = {"Authorization": f"Bearer {admin_key}"}
    wanted = {b.name: {"base_url": b.health_url.removesuffix("/health") + "/v1", "models": [served]}
              for b in backends}
    listed = httpx.get(f"{base_url}/admin/channels", headers=admin, timeout=10).json()["data"]
    for name, fields in wanted.items():
        created = httpx.post(f"{base_url}/admin/channels", headers=admin, json={"name": name, **fields}, timeout=10)
        if created.status_code == 409:
            httpx.patch(f"{base_url}/admin/channels/{name}", headers=admin, json=fields, timeout=10
                        ).raise_for_status()
        else:
            created.raise_for_status()
    for row in listed:
        if row["name"].startswith(REPLICA_PREFIX) and row["name"] not in wanted:
            httpx.delete(f"{base_url}/admin/channels/{row['name']}", headers=admin, timeout=10)


def build_children(args: argparse.Namespace, settings: Settings,
                   data_dir: Path) -> tuple[list[Child], Child, str, bool]:
    logs = data_dir / "logs"
    logs.mkdir(parents=True, exist_ok=True)
    backends = []
    # replicas share the machine's cores: oversubscribed torch threads make every step slower
    threads = max(1, (os.cpu_count() or 1) // args.replicas)
    for i in range(args.replicas):
        port = args.backend_port + i
        argv = _tidegate("backend", "--model", args.model, "--host", "127.0.0.1", "--port", str(port),
                         "--threads", str(threads))
        if args.model == "smollm2":
            argv += ["--served-model-name", "smollm2"]
        backends.append(Child(f"{REPLICA_PREFIX}{i + 1}", argv, f"http://127.0.0.1:{port}/health",
                              logs / f"backend-{i + 1}.log"))
    admin_key, created = secret_file(data_dir / "admin_key", new_admin_key())
    # no channels here: the replicas are registered through the admin API once the gateway is up (register_replicas)
    config = {
        "admin_key_file": str(data_dir / "admin_key"),  # the key itself stays out of config files
        "data_dir": str(data_dir),
    }
    config_path = data_dir / "up-gateway.yaml"
    config_path.write_text(yaml.safe_dump(config))
    config_path.chmod(0o600)
    gw_argv = _tidegate("gateway", "--config", str(config_path), "--host", args.host, "--port", str(args.port))
    if args.redis:
        gw_argv += ["--redis", args.redis]
    gateway = Child("gateway", gw_argv, f"http://{args.host}:{args.port}/health", logs / "gateway.log")
    return backends, gateway, admin_key, created


@dataclass(slots=True)
class ShownKey:
    """A credential as the banner shows it: the secret itself, or only the file that holds it."""

    secret: str
    path: Path
    show: bool

    def line(self) -> str:
        return self.secret if self.show else f"in {self.path} (--show-keys prints it)"

    def shell(self) -> str:
        return self.secret if self.show else f"$(cat {self.path})"

    def python(self) -> str:
        return f'"{self.secret}"' if self.show else f'open("{self.path}").read().strip()'


# A question with one right answer, so a first try shows whether the served model's defaults work.
EXAMPLE_QUESTION = "What is the capital of France?"


def print_banner(url: str, admin_key: ShownKey, api_key: ShownKey, model: str) -> None:
    body = json.dumps({"model": model, "messages": [{"role": "user", "content": EXAMPLE_QUESTION}]})
    print(f"""
tidegate is up at {url}
  admin key: {admin_key.line()}
  API key:   {api_key.line()}

  curl {url}/v1/chat/completions -H "Authorization: Bearer {api_key.shell()}" \\
       -H 'Content-Type: application/json' -d '{body}'

  from openai import OpenAI
  client = OpenAI(base_url="{url}/v1", api_key={api_key.python()})
  print(client.chat.completions.create(model="{model}", messages=[{{"role": "user", "content": "{EXAMPLE_QUESTION}"}}]))

Ctrl-C stops everything.""", flush=True)


def supervise(children: list[Child], stop: list[bool]) -> None:
    """Restart crashed children with exponential backoff until asked to stop."""
    while not stop[0]:
        now = time.monotonic()
        for child in children:
            if child.alive():
                if now - child.started_at > STABLE_AFTER:
                    child.backoff = 1.0
                continue
            if child.restart_at is None:
                code = child.proc.returncode if child.proc else None
                child.restart_at = now + child.backoff
                print(f"{child.name} exited ({code}); restarting in {child.backoff:.0f}s", flush=True)
                child.backoff = min(child.backoff * 2, BACKOFF_MAX)
            elif now >= child.restart_at:
                child.restarts += 1
                child.start()
        time.sleep(0.5)


def main(args: argparse.Namespace) -> int:
    settings: Settings = args.settings
    data_dir = (args.data_dir or settings.gateway.data_dir).expanduser()
    data_dir.mkdir(parents=True, exist_ok=True)
    backends, gateway, admin_key, admin_key_created = build_children(args, settings, data_dir)
    everyone = [*backends, gateway]
    stop = [False]

    def _stop(signum: int, frame: object) -> None:
        stop[0] = True

    signal.signal(signal.SIGINT, _stop)
    signal.signal(signal.SIGTERM, _stop)
    try:
        print(f"starting {len(backends)} backend replica(s); logs in {data_dir / 'logs'}", flush=True)
        for child in backends:
            child.start()
        _wait_healthy(backends, timeout=300)
        gateway.start()
        _wait_healthy([gateway], timeout=60)
        url = f"http://{args.host}:{args.port}"
        served = "smollm2" if args.model == "smollm2" else Path(args.model).stem
        register_replicas(url, admin_key, backends, served)
        api_key, api_key_created = bootstrap_api_key(url, admin_key, data_dir / "api_key")
        # --show-keys: always; --no-show-keys: never (a container log); neither: only the run that created them
        show = args.show_keys
        print_banner(url, ShownKey(admin_key, data_dir / "admin_key", admin_key_created if show is None else show),
                     ShownKey(api_key, data_dir / "api_key", api_key_created if show is None else show), served)
        supervise(everyone, stop)
        return 0
    except RuntimeError as exc:
        print(f"tidegate up: {exc}", file=sys.stderr)
        return 1
    finally:
        print("stopping ...", flush=True)
        for child in reversed(everyone):
            child.stop()
