"""A template-backend mutant, as a module of hooks, whose first ``can_run`` in a process is slow.

A lazy set-up on the first call (an engine imported, a speed measured) costs every ``anyformer
check``, which is always a fresh process; later calls are quick, so only a first-call probe sees it.
"""

from __future__ import annotations

import time
from typing import Any

from kit_mutants import SLOW_CAN_RUN_LIMIT_S

from anyformer import Caps, Model, Request, Verdict, hookimpl
from anyformer_template import plugin as template

#: The first call's set-up: longer than the kit's limit for this mutant.
FIRST_CALL_SECONDS = SLOW_CAN_RUN_LIMIT_S + 0.5
_first_call_done = False


@hookimpl
def can_run(model: Model, caps: Caps, request: Request) -> Verdict:
    """The template's verdict, after a slow set-up on the first call of the process."""
    global _first_call_done
    if not _first_call_done:
        time.sleep(FIRST_CALL_SECONDS)
        _first_call_done = True
    return template.can_run(model, caps, request)


load: Any = template.load
store_list: Any = template.store_list
