"""Every anyformer error code has an HTTP status, and docs/server.md's table shows it."""

from __future__ import annotations

from pathlib import Path

import pytest

from anyformer import AnyformerError, ErrorCode
from anyformer.server._errors import STATUS_BY_CODE, anyformer_error_body, status_of

SERVER_DOC = Path(__file__).resolve().parents[3] / "docs" / "server.md"


@pytest.mark.parametrize("code", list(ErrorCode))
def test_every_error_code_has_a_status_and_a_row_in_the_docs(code: ErrorCode) -> None:
    assert code in STATUS_BY_CODE, f"{code} has no HTTP status in anyformer.server._errors"
    status = STATUS_BY_CODE[code]
    rows = [line for line in SERVER_DOC.read_text().splitlines() if line.startswith("|") and f"`{code.value}`" in line]
    assert rows, f"docs/server.md's error table lacks `{code.value}`"
    assert f"| {status} |" in rows[0], f"docs/server.md gives `{code.value}` another status than {status}"


def test_the_error_body_has_openais_fields_and_our_need() -> None:
    exc = AnyformerError(ErrorCode.BUDGET_TOO_SMALL, "too big", need=123)
    body = anyformer_error_body(exc)["error"]
    assert (body["code"], body["need"], body["param"], body["type"]) == ("BUDGET_TOO_SMALL", 123, None, "server_error")
    assert status_of(exc) == 507
