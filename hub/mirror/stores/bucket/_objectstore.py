"""Object-store primitives for a store kept in an S3-compatible bucket.

What a bucket-backed mirror store needs from the storage, and nothing more: a
location parsed from ``s3://bucket/prefix``, settings from the standard AWS sources,
and on one :class:`ObjectStore`:

- reads: :meth:`~ObjectStore.head` (size, ETag), :meth:`~ObjectStore.get` (whole;
  :meth:`~ObjectStore.get_with_info` with its ETag),
  :meth:`~ObjectStore.get_range` (one byte range), :meth:`~ObjectStore.iter_chunks`
  (streamed in chunks); async twins for the server (``*_async``);
- writes: :meth:`~ObjectStore.put` (bytes), :meth:`~ObjectStore.put_file` (multipart
  above the part size), :meth:`~ObjectStore.put_if_absent` (``If-None-Match: *``) and
  :meth:`~ObjectStore.put_if_match` (``If-Match``: compare-and-swap), both raising
  :class:`PreconditionFailed` when the storage refuses;
- :meth:`~ObjectStore.list` (by prefix, paginated by the storage, streamed),
  :meth:`~ObjectStore.list_uploads` and :meth:`~ObjectStore.abort_upload` (incomplete
  multipart uploads, through botocore: obstore has no call for them),
  :meth:`~ObjectStore.copy` (server-side), :meth:`~ObjectStore.delete`,
  :meth:`~ObjectStore.presigned_get_url`.

Names are relative to the location's prefix. Every failure is an
:class:`ObjectStoreError` (:class:`ObjectNotFound`, :class:`PreconditionFailed`,
:class:`InvalidObjectName`, ...) whose message names the operation and the object,
never the credentials.

The client is obstore (Rust ``object_store``): light to import, sync and async, and
measured against boto3 and aiobotocore in ``docs/object-storage.md``. It is imported
only when a store is opened, as is botocore, which resolves the standard AWS settings
(environment, ``~/.aws/config`` and ``~/.aws/credentials`` profiles, SSO, instance
roles) exactly as the AWS CLI does. Both come with the ``s3`` extra.
"""

from __future__ import annotations

import builtins
import contextlib
import hashlib
import logging
import os
import re
import threading
from collections.abc import AsyncIterator, Callable, Iterable, Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from datetime import datetime, timedelta, timezone
from pathlib import Path
from typing import TYPE_CHECKING, Any, NoReturn

from cmh import CMHError

if TYPE_CHECKING:
    from obstore.store import S3Credential, S3Store

DEFAULT_REGION = "us-east-1"
DEFAULT_PART_SIZE = 8 << 20
MIN_PART_SIZE = 5 << 20  # S3's smallest part (all but the last)
DEFAULT_CHUNK_SIZE = 1 << 20
#: Largest object :meth:`ObjectStore.get` reads whole unless its caller bounds it tighter:
#: anyone who may write to the bucket decides an object's size, so every whole read has
#: a bound checked before the body is read.
MAX_WHOLE_BYTES = 64 << 20
# A refreshable credential (SSO, assumed role, instance role) is asked again this often.
CREDENTIAL_TTL = timedelta(minutes=5)
#: A small request (a HEAD, a DELETE, a whole read or a PUT of at most :data:`QUICK_BYTES`:
#: refs, records, leases, probes) has :data:`QUICK_TIMEOUT` a try and
#: :data:`QUICK_RETRIES` retries, so a storage that stalls one fails it in about 30 s;
#: the other requests (parts, blobs, tree objects, listings) keep ``timeout`` a try.
QUICK_TIMEOUT = timedelta(seconds=10)
QUICK_RETRIES = 2
QUICK_BYTES = 1 << 20
#: Times a PUT whose object does not hold the bytes sent (its ETag is not their MD5: a byte
#: changed on the way) is written again, over that version only, before it fails.
REWRITES = 2
_EXTRA_HINT = "s3:// stores need the s3 extra: pip install 'cmh[s3]'"
_BUCKET_RE = re.compile(r"^[a-z0-9][a-z0-9.-]{1,61}[a-z0-9]\Z")
_CONTROL_RE = re.compile(r"[\x00-\x1f\x7f]")
logger = logging.getLogger("cmh.hub.mirror")
#: (location, key) of each listed key :meth:`ObjectStore._usable` refused: said once each,
#: the first :data:`MAX_SKIPPED_SAID` (anyone who may write to the bucket makes them).
_SKIPPED: set[tuple[S3Location, str]] = set()
MAX_SKIPPED_SAID = 1000
_SKIPPED_LOCK = threading.Lock()


class ObjectStoreError(CMHError):
    """An object-store operation failed (the message says which and why).

    ``operation`` (``"PUT"``, ``"GET"``, ...) and ``endpoint`` (the storage's URL,
    ``None`` for AWS itself) are set on errors of a request to the storage.
    """

    operation: str | None = None
    endpoint: str | None = None


class ObjectNotFound(ObjectStoreError):
    """The object does not exist."""

    def __init__(self, message: str, name: str) -> None:
        super().__init__(message)
        self.name = name


class NoSuchBucket(ObjectStoreError):
    """The bucket does not exist (a HEAD cannot tell: it answers :class:`ObjectNotFound`)."""


class PreconditionFailed(ObjectStoreError):
    """A conditional write was refused: the object exists, or its ETag changed."""

    def __init__(self, message: str, name: str) -> None:
        super().__init__(message)
        self.name = name


class InvalidLocation(ObjectStoreError, ValueError):
    """An ``s3://`` URL or an object name that cannot be used."""


class InvalidObjectName(InvalidLocation):
    """An object name that is empty, absolute, or has empty, ``.`` or ``..`` segments."""


class ObjectTooLarge(ObjectStoreError):
    """An object larger than its reader's bound: its body was not read (``info`` is its
    size, ETag and time)."""

    def __init__(self, message: str, info: ObjectInfo) -> None:
        super().__init__(message)
        self.info = info


class InvalidRange(ObjectStoreError, ValueError):
    """A byte range that is empty or starts at or past the end of the object."""


class SettingsError(ObjectStoreError):
    """The AWS settings are incomplete or contradictory."""


def _unusable(name: str) -> bool:
    """Whether :func:`_check_relpath` refuses ``name``, cheaply enough for every listed
    name (a split only for a name with a segment starting with a dot)."""
    return (
        not name
        or name[0] == "/"
        or name[-1] == "/"
        or "//" in name
        or ((name[0] == "." or "/." in name) and any(s in (".", "..") for s in name.split("/")))
        or _CONTROL_RE.search(name) is not None
    )


def _check_relpath(text: str, what: str, error: type[InvalidLocation]) -> str:
    segments = text.split("/")
    if not text or text.startswith("/") or any(s in ("", ".", "..") for s in segments):
        raise error(f"{what} {text!r}: must be a relative path with no empty, '.' or '..' part")
    if _CONTROL_RE.search(text):
        raise error(f"{what} {text!r}: control characters are not allowed")
    return text


@dataclass(frozen=True)
class S3Location:
    """A bucket and a key prefix (``""`` or ending in ``/``), from ``s3://bucket/prefix``."""

    bucket: str
    prefix: str = ""

    @classmethod
    def parse(cls, url: str) -> S3Location:
        """Parse ``s3://bucket`` or ``s3://bucket/some/prefix`` (a trailing ``/`` is optional)."""
        scheme, sep, rest = url.partition("://")
        if not sep or scheme != "s3":
            raise InvalidLocation(f"{url!r}: not an s3:// URL (expected s3://bucket/prefix)")
        bucket, _, prefix = rest.partition("/")
        if not _BUCKET_RE.match(bucket) or ".." in bucket:
            raise InvalidLocation(
                f"{url!r}: bucket {bucket!r} is not a valid bucket name "
                "(3-63 lowercase letters, digits, '.' or '-')"
            )
        if any(c in prefix for c in "?#"):
            raise InvalidLocation(f"{url!r}: no query or fragment allowed in a store URL")
        prefix = prefix.rstrip("/")
        if prefix:
            _check_relpath(prefix, f"{url!r}: prefix", InvalidLocation)
        return cls(bucket, f"{prefix}/" if prefix else "")

    def key(self, name: str) -> str:
        """The full key of a name relative to the prefix (the name is checked)."""
        return self.prefix + _check_relpath(name, "object name", InvalidObjectName)

    def __str__(self) -> str:
        return f"s3://{self.bucket}/{self.prefix}"


@dataclass(frozen=True)
class Credentials:
    """One set of AWS credentials (the secret parts never appear in ``repr``)."""

    access_key_id: str
    secret_access_key: str = field(repr=False)
    session_token: str | None = field(default=None, repr=False)


@dataclass(frozen=True)
class S3Settings:
    """Where the storage is and how to sign for it.

    ``credentials`` is called whenever fresh credentials are needed (every
    :data:`CREDENTIAL_TTL`), so refreshable ones (SSO, assumed roles) stay valid;
    ``None`` sends unsigned requests (public buckets).
    """

    endpoint: str | None = None
    region: str = DEFAULT_REGION
    credentials: Callable[[], Credentials] | None = field(default=None, repr=False)
    source: str = "explicit"

    @classmethod
    def from_environment(cls, profile: str | None = None) -> S3Settings:
        """Resolve the standard AWS settings from the environment, in the AWS CLI's order.

        Endpoint: ``AWS_ENDPOINT_URL_S3``, ``AWS_ENDPOINT_URL``, then the profile's
        ``endpoint_url`` (its ``services`` section first; none when
        ``AWS_IGNORE_CONFIGURED_ENDPOINT_URLS=true``); none means AWS itself. Region:
        ``AWS_REGION``, ``AWS_DEFAULT_REGION``, the profile's ``region``, then
        ``us-east-1``. Credentials: botocore's chain (the key variables first, then the
        profile ``AWS_PROFILE``, SSO, container and instance roles); an explicit
        ``profile`` uses that profile only, as ``aws --profile`` does.

        When the environment variables alone decide everything (keys set, no profile
        named, and no config file or both endpoint and region set), botocore is not
        imported: that answer is the same and costs no 100-250 ms.
        """
        env = os.environ
        chosen = profile or env.get("AWS_PROFILE") or None
        key, secret = env.get("AWS_ACCESS_KEY_ID"), env.get("AWS_SECRET_ACCESS_KEY")
        endpoint = env.get("AWS_ENDPOINT_URL_S3") or env.get("AWS_ENDPOINT_URL") or None
        region = env.get("AWS_REGION") or env.get("AWS_DEFAULT_REGION") or None
        config_file = Path(env.get("AWS_CONFIG_FILE") or "~/.aws/config").expanduser()
        decided = bool(endpoint and region) or not config_file.exists()
        if chosen is None and key and secret and decided:
            static = Credentials(key, secret, env.get("AWS_SESSION_TOKEN") or None)
            return cls(endpoint, region or DEFAULT_REGION, lambda: static, "environment")
        return cls._from_botocore(profile, chosen, endpoint, region)

    @classmethod
    def _from_botocore(
        cls, profile: str | None, chosen: str | None, endpoint: str | None, region: str | None
    ) -> S3Settings:
        """The settings as botocore resolves them (profiles, SSO, roles).

        Only an explicit ``profile`` is handed to botocore: it then ignores the key
        variables, as ``aws --profile`` does; ``AWS_PROFILE`` is read by botocore
        itself, and the key variables still come first, as in the AWS CLI.
        """
        try:
            import botocore.configprovider
            import botocore.exceptions
            import botocore.session
        except ImportError as exc:  # pragma: no cover - depends on the installation
            raise SettingsError(_EXTRA_HINT) from exc
        session = botocore.session.Session(profile=profile)
        where = f"profile {chosen!r}" if chosen else "the default AWS settings"
        ignore_configured = os.environ.get("AWS_IGNORE_CONFIGURED_ENDPOINT_URLS", "")
        try:
            scoped = session.get_scoped_config()
            if endpoint is None and ignore_configured.lower() != "true":
                endpoint = botocore.configprovider.ConfiguredEndpointProvider(
                    full_config=session.full_config, scoped_config=scoped, client_name="s3"
                ).provide()
            region = region or scoped.get("region") or DEFAULT_REGION
            found = session.get_credentials()
        except botocore.exceptions.BotoCoreError as exc:
            raise SettingsError(f"AWS settings from {where}: {exc}") from None
        if found is None:
            raise SettingsError(
                f"no AWS credentials found in {where}: set AWS_ACCESS_KEY_ID and "
                "AWS_SECRET_ACCESS_KEY, or AWS_PROFILE naming a profile that has them"
            )

        def fresh() -> Credentials:
            frozen = found.get_frozen_credentials()
            return Credentials(frozen.access_key, frozen.secret_key, frozen.token)

        return cls(
            endpoint=str(endpoint) if endpoint else None,
            region=str(region),
            credentials=fresh,
            source=f"{where} ({found.method})",
        )


@dataclass(frozen=True)
class ObjectInfo:
    """What ``head`` and ``list`` tell about an object (``name`` is relative to the prefix)."""

    name: str
    size: int
    etag: str
    last_modified: datetime


@dataclass(frozen=True)
class UploadInfo:
    """An incomplete multipart upload: the object it would create (relative to the
    prefix), its id, the bytes of its parts so far, and when it was last written (its
    newest part, else when it was started), on the storage's clock."""

    name: str
    upload_id: str
    size: int
    last_modified: datetime


class _CredentialProvider:
    """obstore's credential callback over :attr:`S3Settings.credentials`."""

    def __init__(self, credentials: Callable[[], Credentials]) -> None:
        self._credentials = credentials

    def __call__(self) -> S3Credential:
        creds = self._credentials()
        return {
            "access_key_id": creds.access_key_id,
            "secret_access_key": creds.secret_access_key,
            "token": creds.session_token,
            "expires_at": datetime.now(timezone.utc) + CREDENTIAL_TTL,
        }


_STATUS_RE = re.compile(r"status code: (\d{3})( [A-Za-z ]+)?")
_S3_CODE_RE = re.compile(r"<Code>([^<]{1,100})</Code>")
_S3_MESSAGE_RE = re.compile(r"<Message>([^<]{1,300})</Message>")
_PERFORMING_RE = re.compile(
    r"Error performing (\w+ \S+) in .*?(?:after (\d+) retries.*?)?\s+- (.*)$"
)
_IO_KIND_RE = re.compile(r"kind: ([A-Z][A-Za-z]+)")


class Composition:
    """``target`` made by the storage from part objects (:meth:`add`: each one a
    server-side copy into a multipart upload, pinned to the part's ETag with
    ``x-amz-copy-source-if-match``), visible only once :meth:`complete` is called;
    :meth:`abort` leaves nothing. A fill copies its parts once their hash matched (issue
    37: not during the transfer). Every part but the last must be at
    least 5 MiB. Parts may be copied from several threads at once (each its number);
    :meth:`complete` and :meth:`abort` once they are done."""

    def __init__(self, objects: ObjectStore, target: str) -> None:
        self.objects = objects
        self.target = target
        self.upload_id: str | None = None
        self.parts: dict[int, dict[str, Any]] = {}  # number -> {"PartNumber", "ETag"}
        self.confirmed = True  # every copy answered its source's ETag
        self._lock = threading.Lock()

    def add(self, name: str, etag: str, number: int | None = None) -> None:
        """Copy part object ``name`` (pinned to ``etag``) as part ``number`` (the next one
        by default): :class:`PreconditionFailed` when it changed,
        :class:`ObjectStoreError` otherwise."""
        import botocore.exceptions

        objects = self.objects
        client, bucket = objects._s3_client(), objects.location.bucket
        key = objects.location.key(self.target)
        source = {"Bucket": bucket, "Key": objects.location.key(name)}
        try:
            with self._lock:
                if self.upload_id is None:
                    made = client.create_multipart_upload(Bucket=bucket, Key=key)
                    self.upload_id = str(made["UploadId"])
                upload_id = self.upload_id
                if number is None:
                    number = len(self.parts) + 1
            part = client.upload_part_copy(Bucket=bucket, Key=key, UploadId=upload_id,
                                           PartNumber=number, CopySource=source,
                                           CopySourceIfMatch=etag)  # fmt: skip
        except (botocore.exceptions.ClientError, botocore.exceptions.BotoCoreError) as exc:
            _composition_error(objects, self.target, exc)
        answered = str(part["CopyPartResult"]["ETag"])
        with self._lock:
            self.confirmed = self.confirmed and _same_etag(answered, etag)
            self.parts[number] = {"PartNumber": number, "ETag": answered}

    def complete(self) -> tuple[str, bool]:
        """Make the target of the parts added: its ETag, and whether the parts copied are
        known to be the pinned versions (see :meth:`ObjectStore.compose`)."""
        import botocore.exceptions

        where = f"COMPOSE {self.objects.location}{self.target}"
        if self.upload_id is None:
            raise ObjectStoreError(f"{where}: no part")
        if sorted(self.parts) != list(range(1, len(self.parts) + 1)):
            raise ObjectStoreError(f"{where}: parts {sorted(self.parts)} are not 1..n")
        objects = self.objects
        parts = [self.parts[n] for n in sorted(self.parts)]
        try:
            result = objects._s3_client().complete_multipart_upload(
                Bucket=objects.location.bucket, Key=objects.location.key(self.target),
                UploadId=self.upload_id, MultipartUpload={"Parts": parts},
            )  # fmt: skip
        except (botocore.exceptions.ClientError, botocore.exceptions.BotoCoreError) as exc:
            _composition_error(objects, self.target, exc)
        self.upload_id = None
        return str(result["ETag"]), self.confirmed or objects.copy_pins()

    def abort(self) -> None:
        """Abort the upload (its copies are freed; nothing is created); best effort."""
        upload_id, self.upload_id = self.upload_id, None
        if upload_id is not None:
            with contextlib.suppress(ObjectStoreError):
                self.objects.abort_upload(self.target, upload_id)


def _composition_error(objects: ObjectStore, target: str, exc: Exception) -> NoReturn:
    """:class:`PreconditionFailed` for a part that changed, else the upload's error."""
    import botocore.exceptions

    if isinstance(exc, botocore.exceptions.ClientError):
        code = exc.response.get("Error", {}).get("Code")
        if code in ("PreconditionFailed", "412"):
            raise PreconditionFailed(f"COMPOSE {objects.location}{target}: a part changed",
                                     target) from None  # fmt: skip
    objects._upload_error("COMPOSE", target, exc)


def _invalid_listed_path(exc: BaseException) -> bool:
    """Whether obstore refused a listing for a key it cannot take as a path (an empty,
    ``.`` or ``..`` segment): the listing is then done through botocore."""
    return "invalid path" in str(exc).lower()


def _same_etag(a: str, b: str) -> bool:
    """Two ETags alike, quoted or not (servers differ in what they answer a copy)."""
    return a.strip('"') == b.strip('"')


def _describe(exc: BaseException) -> tuple[str, int | None, str | None]:
    """A one-line reason for an obstore error, the HTTP status and the S3 error code.

    obstore's messages run over many lines (a debug dump of the request); this keeps
    the HTTP status, the S3 error code and message, or for a request that got no
    answer, what was tried and the transport error.
    """
    text = str(exc)
    code = _S3_CODE_RE.search(text)
    status = _STATUS_RE.search(text)
    if status:
        reason = f"{status.group(1)}{(status.group(2) or '').rstrip()}"
        if code:
            message = _S3_MESSAGE_RE.search(text)
            reason += f", {code.group(1)}" + (f": {message.group(1)}" if message else "")
        return reason, int(status.group(1)), code.group(1) if code else None
    first = text.strip().splitlines()[0] if text.strip() else type(exc).__name__
    performing = _PERFORMING_RE.search(first)
    if performing:
        request, retries, error = performing.groups()
        kinds = _IO_KIND_RE.findall(text)  # e.g. ConnectionRefused, TimedOut
        if kinds:
            error += f" ({kinds[-1]})"
        first = f"{request}: no answer: {error}" + (f", after {retries} retries" if retries else "")
    return first.removeprefix("Generic S3 error: ")[:300], None, None


def _etag_value(etag: str) -> str:
    """An ETag as the storage wrote it, without quotes or weak mark, lowercase."""
    return etag.strip().removeprefix("W/").strip('"').lower()


class ObjectStore:
    """The objects under one ``s3://bucket/prefix``.

    ``part_size`` is the multipart part size of :meth:`put_file` (at least 5 MiB, S3's
    minimum); ``timeout`` bounds each request, ``max_retries`` the retries of a request
    that failed for a transient reason (connection refused, 5xx).
    """

    def __init__(
        self,
        location: S3Location,
        settings: S3Settings,
        *,
        part_size: int = DEFAULT_PART_SIZE,
        timeout: timedelta = timedelta(seconds=60),
        max_retries: int = 3,
    ) -> None:
        if part_size < MIN_PART_SIZE:
            raise ValueError(f"part_size {part_size} is below S3's minimum of {MIN_PART_SIZE}")
        try:
            from obstore.store import S3Store
        except ImportError as exc:  # pragma: no cover - depends on the installation
            raise SettingsError(_EXTRA_HINT) from exc
        self.location = location
        self.settings = settings
        self.part_size = part_size
        self._secrets: tuple[str, ...] = ()
        self._botocore: Any = None  # made once, when first needed (:meth:`_s3_client`)
        self._botocore_made = threading.Lock()  # or warmed (:meth:`warm_s3_client`)
        self._warming = False
        self._copy_pins: bool | None = None  # whether copies honour their source's ETag
        #: Whether a PUT's object is checked against the MD5 of its body (:meth:`_put`):
        #: over plain ``http://`` only (TLS refuses a changed byte, and AWS checks the signed
        #: body hash), and only while the storage's ETags are MD5s (as S3's are, but for
        #: SSE-KMS and SSE-C): None until a PUT tells.
        plain = bool(settings.endpoint and settings.endpoint.startswith("http://"))
        self._md5_etags: bool | None = None if plain else False
        config: dict[str, Any] = {"region": settings.region}
        if settings.endpoint:
            config["endpoint"] = settings.endpoint
        provider = None
        if settings.credentials is None:
            config["skip_signature"] = True
        else:
            try:  # fail now, not at the first request
                creds = settings.credentials()
            except Exception as exc:  # botocore's refresh errors (expired SSO, ...) vary
                raise SettingsError(f"AWS credentials from {settings.source}: {exc}") from None
            self._secrets = tuple(
                s for s in (creds.secret_access_key, creds.session_token, creds.access_key_id) if s
            )
            provider = _CredentialProvider(settings.credentials)

        def client(timeout: timedelta, retries: int) -> S3Store:
            retry = {
                "max_retries": retries,
                "retry_timeout": timeout * (retries + 1),
                "backoff": {
                    "init_backoff": timedelta(milliseconds=100),
                    "max_backoff": timedelta(seconds=2),
                },
            }
            return S3Store(
                location.bucket,
                config=config,  # type: ignore[arg-type]
                client_options={
                    "allow_http": plain,
                    "timeout": timeout,
                    "connect_timeout": min(timeout, timedelta(seconds=10)),
                },
                retry_config=retry,  # type: ignore[arg-type]
                credential_provider=provider,
            )

        self._store: S3Store = client(timeout, max_retries)
        #: For the small requests (:data:`QUICK_BYTES`): a stall fails them in seconds.
        self._quick: S3Store = client(min(timeout, QUICK_TIMEOUT), min(max_retries, QUICK_RETRIES))

    @classmethod
    def open(cls, url: str, *, profile: str | None = None, **options: Any) -> ObjectStore:
        """Open ``s3://bucket/prefix`` with the standard AWS settings."""
        return cls(S3Location.parse(url), S3Settings.from_environment(profile), **options)

    def __repr__(self) -> str:
        return f"ObjectStore({str(self.location)!r}, endpoint={self.settings.endpoint!r})"

    # -- errors -------------------------------------------------------------------------

    def _fail(self, op: str, name: str, exc: Exception) -> NoReturn:
        """Raise the typed error for an obstore failure of ``op`` on ``name``."""
        from obstore import exceptions as oe

        where = f"{op} {self.location}{name}"
        reason, status, s3_code = _describe(exc)
        for secret in self._secrets:
            reason = reason.replace(secret, "***")
        error: ObjectStoreError
        if s3_code == "NoSuchBucket":
            error = NoSuchBucket(f"{where}: bucket {self.location.bucket!r} does not exist")
        elif isinstance(exc, (oe.NotFoundError, FileNotFoundError)):
            error = ObjectNotFound(f"{where}: no such object", name)
        elif isinstance(exc, (oe.AlreadyExistsError, oe.PreconditionError)):
            error = PreconditionFailed(f"{where}: precondition failed (412)", name)
        elif status == 416:
            error = InvalidRange(f"{where}: range not satisfiable")
        elif isinstance(exc, (oe.PermissionDeniedError, oe.UnauthenticatedError)):
            error = ObjectStoreError(f"{where}: access denied ({reason})")
        else:
            endpoint = self.settings.endpoint
            named = not endpoint or endpoint in reason
            error = ObjectStoreError(f"{where}: {reason}" + ("" if named else f" ({endpoint})"))
        error.operation, error.endpoint = op.split(" ", 1)[0], self.settings.endpoint
        raise error from None

    @staticmethod
    def _errors() -> tuple[type[Exception], ...]:
        """What obstore raises for a failed request (its own classes, and OSError kinds)."""
        from obstore.exceptions import BaseError

        return (BaseError, OSError)

    # -- reads --------------------------------------------------------------------------

    def _info(self, name: str, meta: Mapping[str, Any]) -> ObjectInfo:
        return ObjectInfo(name, int(meta["size"]), str(meta["e_tag"] or ""), meta["last_modified"])

    def head(self, name: str) -> ObjectInfo:
        """Size, ETag and time of one object."""
        import obstore

        key = self.location.key(name)
        try:
            return self._info(name, obstore.head(self._quick, key))
        except self._errors() as exc:
            self._fail("HEAD", name, exc)

    async def head_async(self, name: str) -> ObjectInfo:
        """:meth:`head` without blocking the event loop."""
        import obstore

        key = self.location.key(name)
        try:
            return self._info(name, await obstore.head_async(self._quick, key))
        except self._errors() as exc:
            self._fail("HEAD", name, exc)

    def get(self, name: str, *, limit: int = MAX_WHOLE_BYTES) -> bytes:
        """The whole object (:class:`ObjectTooLarge` when it has more than ``limit`` bytes)."""
        return self.get_with_info(name, limit=limit)[0]

    def get_with_info(self, name: str, *, limit: int = MAX_WHOLE_BYTES) -> tuple[bytes, ObjectInfo]:
        """The whole object and its info from one request, so the ETag is that of these
        bytes (what a compare-and-swap with :meth:`put_if_match` starts from).

        :class:`ObjectTooLarge` when it has more than ``limit`` bytes: its size is known
        from the answer's headers, before any of the body is read."""
        import obstore

        key = self.location.key(name)
        try:
            client = self._quick if limit <= QUICK_BYTES else self._store
            result = obstore.get(client, key)
            info = self._info(name, result.meta)
            if info.size > limit:
                raise ObjectTooLarge(
                    f"GET {self.location}{name}: {info.size} bytes, more than the {limit}"
                    " an object of its kind may have (not read)",
                    info,
                )
            return result.bytes().to_bytes(), info
        except self._errors() as exc:
            self._fail("GET", name, exc)

    @staticmethod
    def _check_range(start: int, end: int | None) -> None:
        if start < 0 or (end is not None and end <= start):
            raise InvalidRange(f"byte range [{start}, {end}) is empty or negative")

    def _range(self, start: int, end: int | None) -> Any:
        return {"offset": start} if end is None else (start, end)

    def get_range(self, name: str, start: int, end: int) -> bytes:
        """Bytes ``[start, end)`` (fewer when the object ends first; :class:`InvalidRange`
        when ``start`` is at or past its end)."""
        self._check_range(start, end)
        return b"".join(self.iter_chunks(name, start, end))

    async def get_range_async(self, name: str, start: int, end: int) -> bytes:
        """:meth:`get_range` without blocking the event loop."""
        self._check_range(start, end)
        return b"".join([chunk async for chunk in self.iter_chunks_async(name, start, end)])

    def iter_chunks(
        self,
        name: str,
        start: int = 0,
        end: int | None = None,
        chunk_size: int = DEFAULT_CHUNK_SIZE,
        if_match: str | None = None,
    ) -> Iterator[bytes]:
        """Bytes ``[start, end)`` (to the end when ``end`` is None) in chunks of about
        ``chunk_size``, one request; with ``if_match`` (an ETag as :meth:`head` or
        :meth:`list` gave it) only from that version of the object, else
        :class:`PreconditionFailed`."""
        import obstore

        self._check_range(start, end)
        key = self.location.key(name)
        options: Any = {} if start == 0 and end is None else {"range": self._range(start, end)}
        if if_match is not None:
            options["if_match"] = if_match
        try:
            result = obstore.get(self._store, key, options=options)
            yield from result.stream(chunk_size)
        except self._errors() as exc:
            self._fail("GET", name, exc)

    async def iter_chunks_async(
        self,
        name: str,
        start: int = 0,
        end: int | None = None,
        chunk_size: int = DEFAULT_CHUNK_SIZE,
        if_match: str | None = None,
    ) -> AsyncIterator[bytes]:
        """:meth:`iter_chunks` without blocking the event loop; with ``if_match`` (an ETag
        as :meth:`head` gave it) only from that version of the object, else
        :class:`PreconditionFailed`."""
        import obstore

        self._check_range(start, end)
        key = self.location.key(name)
        options: Any = {} if start == 0 and end is None else {"range": self._range(start, end)}
        if if_match is not None:
            options["if_match"] = if_match
        try:
            result = await obstore.get_async(self._store, key, options=options)
            async for chunk in result.stream(chunk_size):
                yield chunk
        except self._errors() as exc:
            self._fail("GET", name, exc)

    # -- writes -------------------------------------------------------------------------

    def _put(self, op: str, name: str, data: Any, **kwargs: Any) -> str:
        """One PUT; for bytes over a plain ``http://`` link, the object is proven to hold
        them: its ETag, the MD5 of what the storage received, must be the MD5 of what was
        sent (a byte changed on the way, which nothing else checks there, would otherwise
        be stored, and everything read back after, a blob made of the fill's parts
        included, trusted). A version that differs is written again over itself
        (``If-Match`` on its ETag) up to :data:`REWRITES` times, then the PUT fails (the
        object it created, for a create-only PUT, is deleted). A storage whose ETags are
        not MD5s (SSE-KMS, SSE-C) is told by its first PUTs (none matches, also written
        again) and not checked from then on."""
        etag = self._put_once(op, name, data, **kwargs)
        if not isinstance(data, (bytes, bytearray, memoryview)) or self._md5_etags is False:
            return etag
        sent = hashlib.md5(data, usedforsecurity=False).hexdigest()
        for _ in range(REWRITES):
            if not etag:  # the storage gave none: nothing to check against
                return etag
            if _etag_value(etag) == sent:
                self._md5_etags = True
                return etag
            again = {**kwargs, "mode": {"e_tag": etag}}  # over that version only
            etag = self._put_once(op, name, data, **again)
            if self._md5_etags is None and _etag_value(etag) != sent:
                self._md5_etags = False  # twice: the storage's ETags are not MD5s
                return etag
        if _etag_value(etag) == sent:
            self._md5_etags = True
            return etag
        if kwargs.get("mode") == "create":
            with contextlib.suppress(ObjectStoreError):
                self.delete(name)
        raise ObjectStoreError(
            f"{op} {self.location}{name}: the storage holds other bytes than those sent "
            f"(ETag {etag}, not the MD5 {sent} of the body), {REWRITES + 1} times"
        )

    def _put_once(self, op: str, name: str, data: Any, **kwargs: Any) -> str:
        import obstore

        key = self.location.key(name)
        try:
            small = isinstance(data, (bytes, bytearray, memoryview)) and len(data) <= QUICK_BYTES
            client = self._quick if small else self._store
            return str(obstore.put(client, key, data, **kwargs)["e_tag"] or "")
        except self._errors() as exc:
            self._fail(op, name, exc)

    def put(self, name: str, data: bytes) -> str:
        """Write (or replace) an object in one request; its new ETag."""
        return self._put("PUT", name, data, use_multipart=False)

    def put_file(self, name: str, path: str | os.PathLike[str]) -> str:
        """Write a local file; multipart in parts of ``part_size`` when larger. Its ETag."""
        path = Path(path)
        try:
            size = path.stat().st_size
        except OSError as exc:
            raise ObjectStoreError(f"PUT {self.location}{name}: cannot read {path}: "
                                   f"{exc.strerror}") from None  # fmt: skip
        return self._put(
            "PUT", name, path, use_multipart=size > self.part_size, chunk_size=self.part_size
        )

    def put_stream(self, name: str, chunks: Iterable[bytes]) -> str:
        """Write an object from an iterable of chunks (multipart, parts of ``part_size``).

        An exception raised by ``chunks`` aborts the upload: no object is created (or
        replaced), and the exception propagates as it was raised. Returns the ETag.
        """
        import obstore

        key = self.location.key(name)
        failure: list[BaseException] = []

        def guarded() -> Iterator[bytes]:
            try:
                yield from chunks
            except GeneratorExit:  # the client stopped reading (the upload failed): not ours
                raise
            except BaseException as exc:  # kept, so the caller sees its own error
                failure.append(exc)
                raise

        try:
            result = obstore.put(
                self._store, key, guarded(), use_multipart=True, chunk_size=self.part_size
            )
        except Exception as exc:
            if failure:
                raise failure[0] from None
            if isinstance(exc, self._errors()):
                self._fail("PUT", name, exc)
            error = ObjectStoreError(
                f"PUT {self.location}{name}: upload failed ({type(exc).__name__}: {exc})"
            )
            error.operation, error.endpoint = "PUT", self.settings.endpoint
            raise error from None
        except BaseException:
            if failure:  # e.g. Ctrl-C while reading the source
                raise failure[0] from None
            raise
        return str(result["e_tag"] or "")

    def put_if_absent(self, name: str, data: bytes) -> str:
        """Create an object only if no object has that name (``If-None-Match: *``).

        Raises :class:`PreconditionFailed` when one does. Returns the new ETag.
        """
        return self._put("PUT (create only)", name, data, mode="create")

    def put_if_match(self, name: str, data: bytes, etag: str) -> str:
        """Replace an object only if its ETag is still ``etag`` (``If-Match``; the ETag as
        :meth:`head` or a put returned it, quotes included).

        Raises :class:`PreconditionFailed` when it changed (or was deleted). Returns the
        new ETag.
        """
        try:
            return self._put("PUT (if match)", name, data, mode={"e_tag": etag})
        except ObjectNotFound as exc:  # AWS answers 404 when the object is gone
            raise PreconditionFailed(f"{exc}: it was deleted", name) from None

    def copy(self, source: str, target: str) -> None:
        """Copy an object inside the bucket, done by the storage (no bytes through this
        process); replaces ``target`` if it exists. For moving a blob to quarantine."""
        import obstore

        from_key, to_key = self.location.key(source), self.location.key(target)
        try:
            obstore.copy(self._store, from_key, to_key, overwrite=True)
        except self._errors() as exc:
            self._fail(f"COPY to {self.location}{target} from", source, exc)

    def delete(self, name: str) -> None:
        """Delete an object (deleting a missing object is not an error, as in S3)."""
        import obstore

        key = self.location.key(name)
        try:
            obstore.delete(self._quick, key)
        except self._errors() as exc:
            self._fail("DELETE", name, exc)

    def delete_if_match(self, name: str, etag: str) -> None:
        """Delete an object only while its ETag is ``etag`` (a version known to be bad):
        :class:`PreconditionFailed` when it changed (or is gone), and nothing is deleted.

        A HEAD is compared first (some storages ignore a conditional DELETE); the DELETE
        then carries ``If-Match`` too, so a storage that honours it (AWS) also refuses a
        version written between the two."""
        import botocore.exceptions

        try:
            now = self.head(name).etag
        except ObjectNotFound:
            raise PreconditionFailed(f"DELETE {self.location}{name}: it is gone", name) from None
        if not _same_etag(now, etag):
            raise PreconditionFailed(
                f"DELETE {self.location}{name}: precondition failed: it was replaced", name
            )
        client = self._s3_client()
        try:
            client.delete_object(Bucket=self.location.bucket, Key=self.location.key(name),
                                 IfMatch=etag)  # fmt: skip
        except botocore.exceptions.ClientError as exc:
            code = exc.response.get("Error", {}).get("Code")
            if code in ("PreconditionFailed", "412", "NoSuchKey", "404"):
                raise PreconditionFailed(
                    f"DELETE {self.location}{name}: precondition failed ({code})", name
                ) from None
            self._upload_error("DELETE", name, exc)
        except botocore.exceptions.BotoCoreError as exc:
            self._upload_error("DELETE", name, exc)

    # -- listing and URLs ---------------------------------------------------------------

    def list(self, prefix: str = "") -> Iterator[ObjectInfo]:
        """Every object whose name is under the folder ``prefix`` ("" for all), as the
        storage pages them (ListObjectsV2, 1000 a page); order is the storage's.

        An object whose name cmh would never make (:meth:`_usable`: an empty, ``.`` or
        ``..`` segment, a control character; another tool's) is left out and said once;
        obstore refuses a whole listing holding such a key, so that listing is done again
        through botocore from the last object listed."""
        import obstore

        full = self.location.prefix
        if prefix:
            full += _check_relpath(prefix.rstrip("/"), "list prefix", InvalidObjectName) + "/"
        last: str | None = None
        try:
            for batch in obstore.list(self._store, full.rstrip("/") or None, chunk_size=1000):
                for meta in batch:
                    last = meta["path"]
                    name = last[len(self.location.prefix) :]
                    if self._usable(name):
                        yield self._info(name, meta)
        except self._errors() as exc:
            if not _invalid_listed_path(exc):
                self._fail("LIST", prefix, exc)
            yield from self._list_by_botocore(prefix, full, last)

    def _list_by_botocore(self, prefix: str, full: str, after: str | None) -> Iterator[ObjectInfo]:
        """:meth:`list` through botocore (which takes any key), after the key ``after``."""
        import botocore.exceptions

        client, start = self._s3_client(), self.location.prefix
        options: dict[str, str] = {"Bucket": self.location.bucket, "Prefix": full}
        if after is not None:
            options["StartAfter"] = after
        try:
            for page in client.get_paginator("list_objects_v2").paginate(**options):
                for listed in page.get("Contents", []):
                    name = str(listed["Key"])[len(start) :]
                    if self._usable(name):
                        yield ObjectInfo(name, int(listed["Size"]), str(listed.get("ETag") or ""),
                                         listed["LastModified"])  # fmt: skip
        except (botocore.exceptions.BotoCoreError, botocore.exceptions.ClientError) as exc:
            self._upload_error("LIST", prefix, exc)

    def _usable(self, name: str, what: str = "object", key: str | None = None) -> bool:
        """Whether a listed name is one cmh may use (:meth:`S3Location.key` takes it); one
        that is not (its ``key``, by default the prefix and the name) is said once per
        process (the log; a command's stderr), and never read or deleted."""
        if _unusable(name):
            key = self.location.prefix + name if key is None else key
            with _SKIPPED_LOCK:
                first = (self.location, key) not in _SKIPPED and len(_SKIPPED) < MAX_SKIPPED_SAID
                if first:
                    _SKIPPED.add((self.location, key))
            if first:
                logger.warning(
                    "s3://%s/%s: %s skipped: its name has an empty, '.' or '..' part or a "
                    "control character (not cmh's: never read or deleted)",
                    self.location.bucket, key, what,
                )  # fmt: skip
            return False
        return True

    def warm_s3_client(self) -> None:
        """Make the botocore client (:meth:`compose`'s) on a background thread, once: loading
        botocore's models takes a few tenths of a second, which the end of a fill would
        otherwise wait for. A caller that needs it meanwhile waits for that one client."""
        with self._botocore_made:
            if self._botocore is not None or self._warming:
                return
            self._warming = True
        threading.Thread(target=self._warm, name="cmh-s3-client", daemon=True).start()

    def _warm(self) -> None:
        with contextlib.suppress(Exception):  # raised again to whoever uses the client
            self._s3_client()

    def _s3_client(self) -> Any:
        """A botocore S3 client with this store's settings (for what obstore lacks): one per
        store, made by whichever thread asks first."""
        if self._botocore is not None:
            return self._botocore
        with self._botocore_made:
            if self._botocore is None:
                self._botocore = self._new_s3_client()
            return self._botocore

    def _new_s3_client(self) -> Any:
        try:
            import botocore.config
            import botocore.session
        except ImportError as exc:  # pragma: no cover - depends on the installation
            raise SettingsError(_EXTRA_HINT) from exc
        creds = self.settings.credentials() if self.settings.credentials else None
        config = botocore.config.Config(
            connect_timeout=10,
            read_timeout=60,
            retries={"max_attempts": 4, "mode": "standard"},
            s3={"addressing_style": "path"} if self.settings.endpoint else {},
            signature_version=None if creds else botocore.UNSIGNED,
        )
        return botocore.session.get_session().create_client(
            "s3",
            endpoint_url=self.settings.endpoint,
            region_name=self.settings.region,
            aws_access_key_id=creds.access_key_id if creds else None,
            aws_secret_access_key=creds.secret_access_key if creds else None,
            aws_session_token=creds.session_token if creds else None,
            config=config,
        )

    def _upload_error(self, op: str, name: str, exc: Exception) -> NoReturn:
        reason = str(exc)
        for secret in self._secrets:
            reason = reason.replace(secret, "***")
        error = ObjectStoreError(f"{op} {self.location}{name}: {reason}")
        error.operation, error.endpoint = op, self.settings.endpoint
        raise error from None

    def list_uploads(self, prefix: str = "") -> tuple[UploadInfo, ...]:
        """The incomplete multipart uploads of objects under the folder ``prefix`` ("" for
        all), each with its parts listed (one ListParts per upload)."""
        import botocore.exceptions

        full = self.location.prefix
        if prefix:
            full += _check_relpath(prefix.rstrip("/"), "list prefix", InvalidObjectName) + "/"
        client, bucket = self._s3_client(), self.location.bucket
        out: builtins.list[UploadInfo] = []
        try:
            pages = client.get_paginator("list_multipart_uploads")
            for page in pages.paginate(Bucket=bucket, Prefix=full):
                for upload in page.get("Uploads", []):
                    key, upload_id = str(upload["Key"]), str(upload["UploadId"])
                    size, newest = 0, upload["Initiated"]
                    parts = client.get_paginator("list_parts")
                    for listed in parts.paginate(Bucket=bucket, Key=key, UploadId=upload_id):
                        for part in listed.get("Parts", []):
                            size += int(part.get("Size", 0))
                            newest = max(newest, part.get("LastModified", newest))
                    out.append(UploadInfo(key[len(self.location.prefix) :], upload_id, size,
                                          newest))  # fmt: skip
        except (botocore.exceptions.BotoCoreError, botocore.exceptions.ClientError) as exc:
            self._upload_error("LIST-UPLOADS", prefix, exc)
        return tuple(out)

    def abort_upload(self, name: str, upload_id: str) -> None:
        """Abort an incomplete multipart upload of ``name`` (its parts are freed); one
        already completed or aborted is not an error."""
        self._abort_upload(self.location.key(name), name, upload_id)

    def abort_listed_upload(self, upload: UploadInfo) -> None:
        """Abort an upload :meth:`list_uploads` gave, by the key the storage listed under
        the prefix, as it is: one whose name this store would never make (an empty, ``.``
        or ``..`` segment: another tool's) is freed too. Only that upload id's parts go; no
        object is read, written or deleted."""
        self._abort_upload(self.location.prefix + upload.name, upload.name, upload.upload_id)

    def _abort_upload(self, key: str, name: str, upload_id: str) -> None:
        import botocore.exceptions

        client = self._s3_client()
        try:
            client.abort_multipart_upload(Bucket=self.location.bucket, Key=key, UploadId=upload_id)
        except botocore.exceptions.ClientError as exc:
            if exc.response.get("Error", {}).get("Code") == "NoSuchUpload":
                return
            self._upload_error("ABORT-UPLOAD", name, exc)
        except botocore.exceptions.BotoCoreError as exc:
            self._upload_error("ABORT-UPLOAD", name, exc)

    def compose(self, parts: Sequence[tuple[str, str]], target: str) -> tuple[str, bool]:
        """Make ``target`` the concatenation of the objects ``parts`` (``(name, storage
        ETag)`` each, every one but the last at least 5 MiB) by the storage itself: one
        server-side copy, or a multipart upload of part copies; no byte goes through this
        process. Each source is pinned to its ETag (``x-amz-copy-source-if-match``):
        :class:`PreconditionFailed` when one changed, and nothing is created (the upload is
        aborted). The new object's ETag, and whether the parts copied are known to be the
        pinned versions: every copy answered its source's ETag, or the storage refuses a copy
        pinned to a wrong ETag (:meth:`copy_pins`; moto's server ignores the condition)."""
        if not parts:
            return self.put(target, b""), True
        if len(parts) == 1:
            import botocore.exceptions

            client, bucket, key = self._s3_client(), self.location.bucket, self.location.key(target)
            source = {"Bucket": bucket, "Key": self.location.key(parts[0][0])}
            try:
                copied = client.copy_object(Bucket=bucket, Key=key, CopySource=source,
                                            CopySourceIfMatch=parts[0][1])  # fmt: skip
            except (botocore.exceptions.ClientError, botocore.exceptions.BotoCoreError) as exc:
                _composition_error(self, target, exc)
            answered = str(copied["CopyObjectResult"]["ETag"])
            return answered, _same_etag(answered, parts[0][1]) or self.copy_pins()
        composition = Composition(self, target)
        try:
            for name, etag in parts:
                composition.add(name, etag)
            return composition.complete()
        finally:
            composition.abort()  # nothing once completed; else no upload is left behind

    def copy_pins(self) -> bool:
        """Whether the storage refuses a copy whose ``x-amz-copy-source-if-match`` names
        another version: probed once (a scratch object under ``.cmh/probes/``) and kept."""
        import botocore.exceptions

        if self._copy_pins is None:
            import uuid

            scratch = f".cmh/probes/copy-{uuid.uuid4().hex}"
            client, bucket = self._s3_client(), self.location.bucket
            self.put(scratch, b"probe")
            try:
                source = {"Bucket": bucket, "Key": self.location.key(scratch)}
                target = self.location.key(scratch + "-copy")
                wrong = f'"{"0" * 32}"'
                client.copy_object(
                    Bucket=bucket, Key=target, CopySource=source, CopySourceIfMatch=wrong
                )
                self._copy_pins = False
            except botocore.exceptions.ClientError as exc:
                code = exc.response.get("Error", {}).get("Code")
                self._copy_pins = code in ("PreconditionFailed", "412")
            except botocore.exceptions.BotoCoreError as exc:
                self._upload_error("COPY (probe)", scratch, exc)
            finally:
                for name in (scratch, scratch + "-copy"):
                    with contextlib.suppress(ObjectStoreError):
                        self.delete(name)
        return self._copy_pins

    def list_folders(self, prefix: str = "") -> tuple[str, ...]:
        """The names of the folders directly under ``prefix`` ("" for the top), one
        delimited listing (every page)."""
        import obstore

        full = self.location.prefix
        if prefix:
            full += _check_relpath(prefix.rstrip("/"), "list prefix", InvalidObjectName) + "/"
        try:
            result = obstore.list_with_delimiter(self._store, full.rstrip("/") or None)
        except self._errors() as exc:
            if not _invalid_listed_path(exc):
                self._fail("LIST", prefix, exc)
            return self._folders_by_botocore(prefix, full)
        return tuple(sorted(p[len(full) :].rstrip("/") for p in result["common_prefixes"]))

    def _folders_by_botocore(self, prefix: str, full: str) -> tuple[str, ...]:
        """:meth:`list_folders` through botocore, for a listing obstore refuses (a key it
        takes as an invalid path): the usable folder names alone."""
        import botocore.exceptions

        client, out = self._s3_client(), []
        try:
            pages = client.get_paginator("list_objects_v2")
            for page in pages.paginate(Bucket=self.location.bucket, Prefix=full, Delimiter="/"):
                for common in page.get("CommonPrefixes", []):
                    key = str(common["Prefix"])
                    folder = key[len(full) :].rstrip("/")
                    name = f"{prefix.rstrip('/')}/{folder}" if prefix else folder
                    if self._usable(name, "folder", key):
                        out.append(folder)
        except (botocore.exceptions.BotoCoreError, botocore.exceptions.ClientError) as exc:
            self._upload_error("LIST", prefix, exc)
        return tuple(sorted(out))

    def presigned_get_url(self, name: str, expires_in: timedelta = timedelta(minutes=15)) -> str:
        """A URL that GETs the object (any single ``Range`` allowed) without credentials
        until ``expires_in`` has passed."""
        import obstore

        key = self.location.key(name)
        try:
            return str(obstore.sign(self._store, "GET", key, expires_in))
        except self._errors() as exc:
            self._fail("SIGN", name, exc)
