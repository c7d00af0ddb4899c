"""One bucket through boto3: the S3 client built with bounded timeouts and retries (credentials from
the standard boto3 chain, never read here), whether it signs payloads, and every call run with
botocore's errors translated into the store's typed errors (`SnapshotUnavailable` when temporary).
"""

from __future__ import annotations

import builtins
import contextlib
import functools
from collections.abc import Callable
from typing import Any, TypeVar

import boto3
import botocore.exceptions as bexc
from botocore.config import Config

from snapshots.errors import SnapshotError, SnapshotNotFound, SnapshotUnavailable
from snapshots.ref import SnapshotRef

_T = TypeVar("_T")

# Transport-level failures: the store is down, unreachable, or too slow. All temporary.
UNAVAILABLE_ERRORS: tuple[type[BaseException], ...] = (
    bexc.ConnectionError,  # EndpointConnectionError, ConnectTimeoutError, ProxyConnectionError
    bexc.HTTPClientError,  # ReadTimeoutError, ConnectionClosedError, ResponseStreamingError
    bexc.IncompleteReadError,
)
TEMPORARY_CODES = frozenset(
    {"InternalError", "ServiceUnavailable", "SlowDown", "RequestTimeout", "Throttling", "ThrottlingException"}
)
NOT_FOUND_CODES = frozenset({"NoSuchKey", "NotFound", "404"})


def build_client(
    endpoint_url: str | None,
    region: str | None,
    *,
    connect_timeout: float,
    read_timeout: float,
    max_attempts: int,
    addressing_style: str | None,
    upload_concurrency: int,
) -> Any:
    """A boto3 S3 client whose calls cannot hang for long when the store is down.

    `addressing_style` defaults to "path" when `endpoint_url` is set (MinIO/Ceph need no wildcard
    DNS then) and to botocore's "auto" otherwise.
    """
    style = addressing_style or ("path" if endpoint_url else "auto")
    if style not in ("auto", "path", "virtual"):
        raise ValueError(f"addressing_style must be auto, path or virtual, not {style!r}")
    options: dict[str, Any] = {
        "connect_timeout": connect_timeout,
        "read_timeout": read_timeout,
        "retries": {"total_max_attempts": max_attempts, "mode": "standard"},
        "s3": {"addressing_style": style},
        "max_pool_connections": max(10, upload_concurrency + 2),  # parts + reads alongside
    }
    if "request_checksum_calculation" in Config.OPTION_DEFAULTS:  # botocore >= 1.36
        options["request_checksum_calculation"] = "when_required"
        options["response_checksum_validation"] = "when_required"
    config = Config(**options)
    return boto3.session.Session().client("s3", endpoint_url=endpoint_url, region_name=region, config=config)


def signs_payload(client: Any) -> bool:
    """Whether `client` signs every request body's sha256 (SigV4 with payload signing not turned off).

    botocore then sends `x-amz-content-sha256`, which S3 checks against the body, so a body damaged
    in transit is refused; without Content-MD5 it signs the payload over HTTPS too. A Content-MD5
    would check the same thing again, at the cost of another pass over the bytes.
    """
    config = getattr(getattr(client, "meta", None), "config", None)
    if config is None:
        return False
    s3 = getattr(config, "s3", None) or {}
    return config.signature_version in (None, "s3v4", "v4") and s3.get("payload_signing_enabled") is not False


class S3Calls:
    """The calls of one bucket, each with its errors typed (the store's `bucket` and `_client`)."""

    bucket: str
    _client: Any

    def _call(self, action: str, key: str, fn: Callable[[], _T], ref: SnapshotRef | None = None) -> _T:
        """Run one S3 call, translating botocore's errors into the store's typed errors."""
        try:
            return fn()
        except bexc.ClientError as e:
            err = e.response.get("Error", {})
            code = str(err.get("Code", ""))
            status = int(e.response.get("ResponseMetadata", {}).get("HTTPStatusCode", 0) or 0)
            if ref is not None and code != "NoSuchBucket" and (code in NOT_FOUND_CODES or status == 404):
                raise SnapshotNotFound(ref) from e
            where = f"s3://{self.bucket}/{key}"
            if status >= 500 or code in TEMPORARY_CODES:
                raise SnapshotUnavailable(f"S3 {action} {where} failed temporarily: {code} {status}") from e
            raise SnapshotError(f"S3 {action} {where} failed: {code}: {err.get('Message', '')}") from e
        except UNAVAILABLE_ERRORS as e:
            raise SnapshotUnavailable(
                f"S3 store at {self._client.meta.endpoint_url} unavailable during {action} "
                f"s3://{self.bucket}/{key}: {e}"
            ) from e
        except bexc.BotoCoreError as e:  # e.g. NoCredentialsError: configuration, not temporary
            raise SnapshotError(f"S3 {action} s3://{self.bucket}/{key} failed: {e}") from e

    def _abort(self, key: str, upload_id: str) -> None:
        with contextlib.suppress(Exception):
            self._client.abort_multipart_upload(Bucket=self.bucket, Key=key, UploadId=upload_id)

    def _delete_quietly(self, key: str) -> None:
        with contextlib.suppress(Exception):
            self._client.delete_object(Bucket=self.bucket, Key=key)

    def _delete_keys(self, keys: builtins.list[str]) -> None:
        for i in range(0, len(keys), 1000):
            batch = keys[i : i + 1000]
            resp = self._call(
                "DeleteObjects",
                batch[0],
                functools.partial(
                    self._client.delete_objects,
                    Bucket=self.bucket,
                    Delete={"Objects": [{"Key": k} for k in batch], "Quiet": True},
                ),
            )
            errors = resp.get("Errors") or []
            if errors:
                first = errors[0]
                raise SnapshotError(
                    f"S3 DeleteObjects failed for {len(errors)} key(s), first "
                    f"s3://{self.bucket}/{first.get('Key')}: {first.get('Code')}: {first.get('Message')}"
                )

    def _list_objects(self, base: str, recursive: bool) -> builtins.list[dict[str, Any]]:
        def run() -> builtins.list[dict[str, Any]]:
            kwargs: dict[str, Any] = {"Bucket": self.bucket, "Prefix": base}
            if not recursive:
                kwargs["Delimiter"] = "/"
            out: builtins.list[dict[str, Any]] = []
            for page in self._client.get_paginator("list_objects_v2").paginate(**kwargs):
                out.extend(page.get("Contents", []))
            return out

        return self._call("ListObjectsV2", base, run)

    def _uri(self, key: str) -> str:
        return f"s3://{self.bucket}/{key}"
