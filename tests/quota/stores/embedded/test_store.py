"""The embedded store: exact under threads, durable across a reopen, secrets only as hashes on disk."""

from __future__ import annotations

import asyncio
import threading
from pathlib import Path

from config.stores import StoreSettings
from quota import Admission, KeyInfo, LimitName, QuotaService, hash_secret, open_store
from quota.stores.embedded.store import DB_NAME
from tests.quota.conftest import make_tenant


def hammer_from_threads(service: QuotaService, key: KeyInfo, threads: int, per_thread: int,
                        estimate: int = 10) -> list[Admission]:
    """Each thread runs its own event loop with `per_thread` concurrent admissions."""
    answers: list[Admission] = []
    lock = threading.Lock()
    start = threading.Barrier(threads)

    def worker(n: int) -> None:
        async def burst() -> list[Admission]:
            return list(await asyncio.gather(*(
                service.admit(key, model="m", estimated_tokens=estimate, request_id=f"t{n}-{i}")
                for i in range(per_thread))))
        start.wait()
        got = asyncio.run(burst())
        with lock:
            answers.extend(got)

    pool = [threading.Thread(target=worker, args=(n,)) for n in range(threads)]
    for thread in pool:
        thread.start()
    for thread in pool:
        thread.join()
    return answers


async def test_threads_and_tasks_admit_exactly_the_rpm_limit(tmp_path: Path) -> None:
    service = await open_store(StoreSettings(data_dir=tmp_path))
    tenant = await make_tenant(service, key={"rpm": 100})
    answers = await asyncio.to_thread(hammer_from_threads, service, tenant.keys[0], 8, 250)
    assert len(answers) == 2000 and sum(a.admitted for a in answers) == 100
    await service.close()


async def test_threads_never_pass_a_shared_account_token_cap(tmp_path: Path) -> None:
    service = await open_store(StoreSettings(data_dir=tmp_path))
    tenant = await make_tenant(service, keys=4, account={"tpm": 5_000}, key={"max_concurrency": 1000})
    results = await asyncio.gather(*(asyncio.to_thread(hammer_from_threads, service, key, 2, 200, 30)
                                     for key in tenant.keys))
    answers = [a for batch in results for a in batch]
    assert sum(a.admitted for a in answers) * 30 == 5_000 // 30 * 30
    assert {a.refused_limit for a in answers if not a.admitted} == {LimitName.tpm}
    await service.close()


async def test_tenancy_ledger_and_daily_budget_survive_a_reopen(tmp_path: Path) -> None:
    settings = StoreSettings(data_dir=tmp_path)
    service = await open_store(settings)
    tenant = await make_tenant(service, with_sub=True, account={"tokens_per_day": 1000}, key={"rpm": 7})
    answer = await service.admit(tenant.keys[0], model="m", estimated_tokens=900, request_id="a")
    assert answer.reservation is not None
    await service.settle(answer.reservation, prompt_tokens=500, completion_tokens=300, model="m")
    await service.close()

    reopened = await open_store(settings)
    auth = await reopened.authenticate(tenant.secrets[0])
    assert auth.ok and auth.key == tenant.keys[0]
    assert (await reopened.admin.get_key(tenant.keys[0].id)).quota.rpm == 7
    assert [s.id for s in await reopened.admin.list_sub_accounts(tenant.account_id)] == [tenant.sub_account_id]
    usage = await reopened.admin.usage(account_id=tenant.account_id)
    assert (usage.prompt_tokens, usage.completion_tokens, usage.requests) == (500, 300, 1)
    # 800 of the 1000 daily tokens were settled before the restart; the budget remembers them.
    refused = await reopened.admit(auth.key, model="m", estimated_tokens=201, request_id="b")
    assert not refused.admitted and refused.refused_limit == LimitName.tokens_per_day
    assert (await reopened.admit(auth.key, model="m", estimated_tokens=200, request_id="c")).admitted
    await reopened.close()


async def test_secret_is_stored_only_as_its_sha256(tmp_path: Path) -> None:
    service = await open_store(StoreSettings(data_dir=tmp_path))
    tenant = await make_tenant(service)
    await service.close()
    stored = b"".join(p.read_bytes() for p in tmp_path.iterdir() if p.name.startswith(DB_NAME))
    assert tenant.secrets[0].encode() not in stored
    assert tenant.secrets[0][3:].encode() not in stored
    assert hash_secret(tenant.secrets[0]).encode() in stored
