"""A chat template is code from a stranger: every render is held to a deadline, loop steps and sizes.

Each hostile template here hung a worker or took gigabytes before the budget existed; now each one
is ``BAD_MODEL`` within the time limit and with bounded memory, while real templates render as before.
"""

from __future__ import annotations

import time
import tracemalloc
from typing import Any

import pytest

from anyformer import AnyformerError, ErrorCode, render_chat
from anyformer import _chat_template as chat_template

HI = [{"role": "user", "content": "hi"}]

#: Templates that loop 10^10 times, or make a value of gigabytes, each in a different way.
HOSTILE = {
    "nested loops 10^10": "{% for a in range(100000) %}{% for b in range(100000) %}{% endfor %}{% endfor %}x",
    "doubling with ~": "{% set s = 'x' %}" + "{% set s = s ~ s %}" * 40 + "{{ s|length }}",
    "repeat operator": "{{ 'x' * 1000000000 }}",
    "center filter": "{{ 'x'|center(1000000000) }}",
    "percent format width": "{{ '%1000000000d' % 1 }}",
    "str.format width": "{{ '{:>1000000000}'.format(1) }}",
    "output bomb": "{% for a in range(100000) %}{% for b in range(100) %}{{ 'y' * 1000 }}{% endfor %}{% endfor %}",
    "list growth": "{% set ns = namespace(l=[]) %}{% for a in range(2000) %}{% set ns.l = ns.l + ns.l + [a] %}"
    "{% endfor %}",
    "exponential macro": "{% macro f(n) %}{% if n %}{{ f(n-1) }}{{ f(n-1) }}{% endif %}{% endmacro %}{{ f(40) }}",
    "power": "{{ 10 ** 100000000 }}",
}


@pytest.fixture
def short_limit(monkeypatch: pytest.MonkeyPatch) -> float:
    """A one-second render limit, so the template that only the clock stops is quick to test."""
    monkeypatch.setattr(chat_template, "RENDER_SECONDS", 1.0)
    monkeypatch.setattr(chat_template.render_chat, "__kwdefaults__", {**render_chat.__kwdefaults__, "time_limit": 1.0})
    return 1.0


@pytest.mark.safety("G16")
@pytest.mark.parametrize("template", list(HOSTILE.values()), ids=list(HOSTILE))
def test_a_hostile_template_is_stopped_within_the_limit_with_bounded_memory(template: str, short_limit: float) -> None:
    tracemalloc.start()
    started = time.monotonic()
    try:
        with pytest.raises(AnyformerError) as caught:
            render_chat(template, HI)
        elapsed = time.monotonic() - started
        _, peak = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()
    assert caught.value.code is ErrorCode.BAD_MODEL, caught.value.message
    assert "stopped" in caught.value.message or "failed" in caught.value.message
    assert elapsed < short_limit + 1.5, f"{elapsed:.1f} s"
    # The largest value allowed is 16 Mi characters; a doubling may make one twice that before it is refused.
    assert peak < 3 * chat_template.MAX_RENDERED_CHARS + 16 * 2**20, f"peaked at {peak / 2**20:.0f} MiB"


def test_the_caller_cap_stops_a_long_prompt_before_it_is_all_rendered() -> None:
    long = [{"role": "user", "content": "word " * 200_000}]
    with pytest.raises(AnyformerError) as caught:
        render_chat(None, long, max_chars=10_000)
    assert caught.value.code is ErrorCode.BAD_REQUEST and "10,000 characters" in caught.value.message


def test_a_long_conversation_renders_whole_past_the_default_size() -> None:
    text = "a" * (chat_template.MAX_RENDERED_CHARS + 10)
    assert text in render_chat(None, [{"role": "user", "content": text}])


REAL_TEMPLATE = (
    "{{ bos_token }}{% set ns = namespace(system='') %}{% for m in messages %}"
    "{% if m.role == 'system' %}{% set ns.system = m.content %}{% endif %}{% endfor %}"
    "{% if ns.system %}<<SYS>>{{ ns.system | trim }}<</SYS>>{% endif %}"
    "{% for m in messages[1:] if m.role != 'system' %}{{ '[' ~ m.role | upper ~ '] ' ~ m.content }}"
    "{% if not loop.last %}\n{% endif %}{% endfor %}{{ {'n': messages | length} | tojson }}"
    "{{ '%s/%d' % ('x', 2) }}{{ '{}!'.format('ok') }}{{ '-' * 3 }}{% if add_generation_prompt %}[A]{% endif %}"
)


def test_real_template_features_render_as_jinja2s_own_sandbox_does() -> None:
    import json

    from jinja2.sandbox import ImmutableSandboxedEnvironment

    messages = [
        {"role": "system", "content": " be brief "},
        {"role": "user", "content": "hi"},
        {"role": "assistant", "content": "hello"},
    ]
    reference = ImmutableSandboxedEnvironment(trim_blocks=True, lstrip_blocks=True)
    reference.filters["tojson"] = lambda value, indent=None: json.dumps(value, indent=indent)
    expected = reference.from_string(REAL_TEMPLATE).render(
        messages=messages, bos_token="<s>", eos_token="", add_generation_prompt=True
    )
    assert render_chat(REAL_TEMPLATE, messages, bos_token="<s>") == expected
    assert expected.startswith("<s><<SYS>>be brief<</SYS>>[USER] hi") and expected.endswith("x/2ok!---[A]")


def test_a_render_past_its_limit_in_a_worker_calls_the_hard_stop(monkeypatch: pytest.MonkeyPatch) -> None:
    reasons: list[str] = []
    monkeypatch.setattr(chat_template, "HARD_STOP_GRACE_SECONDS", 0.1)
    monkeypatch.setattr(chat_template, "_hard_stop", reasons.append)

    def native_call_that_runs_long() -> str:  # what the sandbox's checks cannot interrupt
        time.sleep(0.6)
        return ""

    with pytest.raises(AnyformerError):
        render_chat("{{ slow() }}", HI, time_limit=0.2, slow=native_call_that_runs_long)
    assert reasons and "ended itself" in reasons[0]
    render_chat(None, HI, time_limit=0.2)
    time.sleep(0.4)
    assert len(reasons) == 1, "a render that ended in time must disarm the hard stop"


def test_the_budget_is_per_render_and_threads_do_not_share_it() -> None:
    import concurrent.futures

    loop = "{% for a in range(6) %}{% for b in range(100000) %}{% endfor %}{% endfor %}ok"  # 60 % of the steps each
    with concurrent.futures.ThreadPoolExecutor(2) as pool:
        results: list[Any] = list(pool.map(lambda _: render_chat(loop, HI), range(2)))
    assert results == ["ok", "ok"]


@pytest.mark.parametrize("template", ["{{ range(1000000) }}", "{{ 1 / 0 }}", "{{ 2.0 ** 5000 }}"])
def test_arithmetic_errors_in_a_template_are_bad_model(template: str) -> None:
    with pytest.raises(AnyformerError) as caught:
        render_chat(template, HI)
    assert caught.value.code is ErrorCode.BAD_MODEL


def test_a_cancel_stops_a_render_in_progress() -> None:
    import threading

    cancel = threading.Event()
    threading.Timer(0.2, cancel.set).start()
    started = time.monotonic()
    with chat_template.cancelled_by(cancel), pytest.raises(AnyformerError) as caught:
        render_chat(HOSTILE["exponential macro"], HI)  # would run until the 5 s limit
    assert caught.value.code is ErrorCode.CANCELLED
    assert time.monotonic() - started < 2
    assert render_chat(None, HI)  # outside the block, no cancel applies
