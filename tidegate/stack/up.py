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
import socket
import sys
import time
from collections.abc import Callable
from dataclasses import dataclass
from functools import partial
from pathlib import Path

import httpx
import yaml

from config import Settings
from config.secret_files import new_token
from tidegate.stack.autoscale import ScalePolicy
from tidegate.stack.elastic import ElasticReplicas, minute_of_day
from tidegate.stack.processes import Child, local_get
from tidegate.stack.replica_channels import REPLICA_PREFIX, ReplicaChannels
from tidegate.stack.secret_files import new_admin_key, secret_file, write_secret

BACKOFF_MAX = 30.0
BACKEND_TOKEN_FILE = "backend_token"  # the gateway's bearer to its replicas: only it may set cache_salt, priority
STABLE_AFTER = 60.0  # a child that has lived this long gets its backoff reset


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
                if local_get(child.health_url).status_code == 200:
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


def _port(preferred: int, reserved: int) -> int:
    """`preferred` when it is free, else one the system picks: a replica added at run time must not collide, and
    none may take `reserved`, the gateway's port, which is not bound yet when the first replicas start (a replica
    there would answer the gateway's health check)."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        try:
            if preferred == reserved:
                raise OSError
            sock.bind(("127.0.0.1", preferred))
        except OSError:
            sock.bind(("127.0.0.1", 0))
        port = int(sock.getsockname()[1])
    return port if port != reserved else _port(0, reserved)


def _check_free(host: str, port: int) -> None:
    """The gateway's port must be free before anything starts: whatever holds it would answer the health check
    and the admin calls in the gateway's place."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)  # as the server binds: TIME_WAIT is no owner
        try:
            sock.bind((host, port))
        except OSError as exc:
            raise RuntimeError(f"cannot listen on {host}:{port} ({exc.strerror}); choose another --port") from None


def backend_child(args: argparse.Namespace, logs: Path, index: int) -> Child:
    """Replica `index` (from 1): the same flags for every replica, on the next port after the first's if free."""
    port = _port(args.backend_port + index - 1, args.port)
    # replicas share the machine's cores: oversubscribed torch threads make every step slower, so each gets its
    # share of the most replicas there may be
    threads = max(1, (os.cpu_count() or 1) // args.replicas.max)
    argv = _tidegate("backend", "--model", args.model, "--host", "127.0.0.1", "--port", str(port),
                     "--threads", str(threads), "--gateway-token-file", str(logs.parent / BACKEND_TOKEN_FILE))
    if args.model == "smollm2":
        argv += ["--served-model-name", "smollm2"]
    return Child(f"{REPLICA_PREFIX}{index}", argv, f"http://127.0.0.1:{port}/health", logs / f"backend-{index}.log")


def build_gateway(args: argparse.Namespace, data_dir: Path) -> tuple[Child, str, bool]:
    admin_key, created = secret_file(data_dir / "admin_key", new_admin_key())
    # no channels here: the replicas are registered through the admin API once the gateway is up
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
    gateway = Child("gateway", gw_argv, f"http://{args.host}:{args.port}/health", data_dir / "logs" / "gateway.log")
    return gateway, admin_key, created


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


def supervise(children: list[Child], stop: list[bool], tick: Callable[[], None] | None = None) -> None:
    """Restart crashed children with exponential backoff until asked to stop; `tick` runs once per round."""
    while not stop[0]:
        now = time.monotonic()
        for child in list(children):
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
        if tick is not None:
            tick()
        time.sleep(0.5)


def main(args: argparse.Namespace) -> int:
    settings: Settings = args.settings
    data_dir = (args.data_dir or settings.gateway.data_dir).expanduser()
    data_dir.mkdir(mode=0o700, parents=True, exist_ok=True)  # keys, the store and logs: the owner's only
    (data_dir / "logs").mkdir(mode=0o700, exist_ok=True)
    policy = ScalePolicy(args.replicas, args.schedule, settings.autoscale, settings.backend.max_num_seqs)
    make_replica = partial(backend_child, args, data_dir / "logs")
    backend_token = secret_file(data_dir / BACKEND_TOKEN_FILE, new_token())[0]
    backends = [make_replica(i + 1) for i in range(policy.floor(minute_of_day()))]
    gateway, admin_key, admin_key_created = build_gateway(args, data_dir)
    everyone = [*backends, gateway]  # the supervised children; an elastic stack adds and removes replicas
    stop = [False]

    def _stop(signum: int, frame: object) -> None:
        stop[0] = True

    signal.signal(signal.SIGINT, _stop)
    signal.signal(signal.SIGTERM, _stop)
    try:
        _check_free(args.host, args.port)
        print(f"starting {len(backends)} backend replica(s); logs in {data_dir / 'logs'}", flush=True)
        for child in backends:
            child.start()
        _wait_healthy(backends, timeout=300)
        gateway.start()
        _wait_healthy([gateway], timeout=60)
        url = f"http://{args.host}:{args.port}"
        served = "smollm2" if args.model == "smollm2" else Path(args.model).stem
        channels = ReplicaChannels(url, admin_key, served, backend_token)
        for child in backends:
            channels.register(child.name, child.url)
        channels.drain_all_but(child.name for child in backends)
        api_key, api_key_created = bootstrap_api_key(url, admin_key, data_dir / "api_key")
        # --show-keys: always; --no-show-keys: never (a container log); neither: only the run that created them
        show = args.show_keys
        print_banner(url, ShownKey(admin_key, data_dir / "admin_key", admin_key_created if show is None else show),
                     ShownKey(api_key, data_dir / "api_key", api_key_created if show is None else show), served)
        tick = None
        if args.replicas.elastic:
            elastic = ElasticReplicas(policy, make_replica, channels, everyone)
            elastic.adopt(backends)
            tick = elastic.tick
            print(f"autoscaling between {args.replicas.min} and {args.replicas.max} replicas", flush=True)
        supervise(everyone, stop, tick)
        return 0
    except RuntimeError as exc:
        print(f"tidegate up: {exc}", file=sys.stderr)
        return 1
    finally:
        print("stopping ...", flush=True)
        for child in reversed(everyone):
            child.stop()
