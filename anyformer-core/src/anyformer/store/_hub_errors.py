"""Hub failures as ``AnyformerError``: what the describe path and the downloader both raise.

Its own module so that the downloader (``_download``) and the describe path (``_hub``) share it
without importing each other.
"""

from __future__ import annotations

import contextlib
import errno
import os
from collections.abc import Iterator

import httpx2
from huggingface_hub import constants
from huggingface_hub.errors import (
    GatedRepoError,
    HfHubHTTPError,
    LocalEntryNotFoundError,
    OfflineModeIsEnabled,
    RemoteEntryNotFoundError,
    RepositoryNotFoundError,
    RevisionNotFoundError,
)

from anyformer.contract._errors import AnyformerError, ErrorCode

__all__ = ["hub_errors", "hub_ref", "is_offline", "offline_error"]


def hub_ref(repo_id: str, revision: str | None) -> str:
    """``repo@revision``, or the bare repo id when no revision is named."""
    return f"{repo_id}@{revision}" if revision else repo_id


def is_offline() -> bool:
    """True when huggingface_hub must not open a connection (``HF_HUB_OFFLINE``, read now, not at import)."""
    # constants.HF_HUB_OFFLINE is read once at import; the variable may have been set since.
    return constants.is_offline_mode() or os.environ.get("HF_HUB_OFFLINE", "").upper() in constants.ENV_VARS_TRUE_VALUES


def offline_error(repo_id: str, revision: str | None, cause: BaseException | None = None) -> AnyformerError:
    """``OFFLINE`` for a repo that is not cached, saying why the Hub cannot be asked and what to pull."""
    reason = "HF_HUB_OFFLINE is set" if is_offline() else "the Hub cannot be reached"
    return AnyformerError(
        ErrorCode.OFFLINE,
        f"{hub_ref(repo_id, revision)} is not in the local cache and {reason}; "
        f"run `anyformer pull {hub_ref(repo_id, revision)}` while online",
        cause=cause,
    )


@contextlib.contextmanager
def hub_errors(repo_id: str, revision: str | None, filename: str | None = None) -> Iterator[None]:
    """Turn huggingface_hub and HTTP errors raised inside into ``AnyformerError`` (cause kept).

    Missing repo, revision or file is ``MODEL_NOT_FOUND``; offline mode or no connection is
    ``OFFLINE``; anything the Hub answers that is not what a Hub answers (5xx, junk, short
    bodies) is ``DOWNLOAD_FAILED``; a full disk is ``DISK_FULL``.
    """
    ref = hub_ref(repo_id, revision)
    what = f"{filename} of {ref}" if filename else ref
    try:
        yield
    except AnyformerError:
        raise
    except GatedRepoError as exc:
        raise AnyformerError(
            ErrorCode.MODEL_NOT_FOUND,
            f"{ref} is gated: accept its terms on the Hub and log in (hf auth login)",
            cause=exc,
        ) from exc
    except RepositoryNotFoundError as exc:
        raise AnyformerError(
            ErrorCode.MODEL_NOT_FOUND, f"no model {repo_id} on the Hub (or it is private; log in to see it)", cause=exc
        ) from exc
    except RevisionNotFoundError as exc:
        raise AnyformerError(
            ErrorCode.MODEL_NOT_FOUND, f"{repo_id} has no revision {revision or 'main'} on the Hub", cause=exc
        ) from exc
    except RemoteEntryNotFoundError as exc:
        raise AnyformerError(ErrorCode.MODEL_NOT_FOUND, f"{ref} has no file {filename} on the Hub", cause=exc) from exc
    except HfHubHTTPError as exc:
        status = exc.response.status_code if exc.response is not None else None
        if status in (401, 404):
            raise AnyformerError(
                ErrorCode.MODEL_NOT_FOUND, f"the Hub has no {what} (HTTP {status})", cause=exc
            ) from exc
        raise AnyformerError(
            ErrorCode.DOWNLOAD_FAILED, f"the Hub answered HTTP {status} for {what}", cause=exc
        ) from exc
    except OfflineModeIsEnabled as exc:
        raise offline_error(repo_id, revision, exc) from exc
    except LocalEntryNotFoundError as exc:
        # hf_hub_download raises this when its HEAD failed and the cache has nothing; the cause says why.
        cause = exc.__cause__
        if cause is None or isinstance(cause, (OfflineModeIsEnabled, httpx2.ConnectError, httpx2.ConnectTimeout)):
            raise offline_error(repo_id, revision, exc) from exc
        raise AnyformerError(
            ErrorCode.DOWNLOAD_FAILED, f"the Hub did not answer like the Hub for {what}: {cause}", cause=exc
        ) from exc
    except (httpx2.ConnectError, httpx2.ConnectTimeout) as exc:
        raise offline_error(repo_id, revision, exc) from exc
    except httpx2.HTTPError as exc:
        raise AnyformerError(
            ErrorCode.DOWNLOAD_FAILED, f"fetching {what} failed: {type(exc).__name__}: {exc}", cause=exc
        ) from exc
    except OSError as exc:
        if exc.errno == errno.ENOSPC:
            raise AnyformerError(ErrorCode.DISK_FULL, f"no room on disk for {what}", cause=exc) from exc
        raise AnyformerError(ErrorCode.DOWNLOAD_FAILED, f"fetching {what} failed: {exc}", cause=exc) from exc
    except (ValueError, KeyError, TypeError, AttributeError) as exc:
        # r.json() on junk, or JSON that is not a model info (huggingface_hub indexes into it).
        raise AnyformerError(
            ErrorCode.DOWNLOAD_FAILED, f"the Hub's answer for {what} is not what the Hub sends: {exc!r}", cause=exc
        ) from exc
