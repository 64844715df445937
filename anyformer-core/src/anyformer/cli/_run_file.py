"""``anyformer run MODEL FILE`` for a model that reads a file rather than chats: a speech model transcribes it.

The audio is decoded and resampled by PyAV when the ``speech`` extra is installed (MP3, Ogg, WebM,
FLAC, M4A, WAV at any rate); without it the path goes to the backend as it is (a WAV at the model's rate).
"""

from __future__ import annotations

import argparse
import importlib.util
import json
import os
from typing import Any

from anyformer._loaded import Loaded
from anyformer.contract._errors import AnyformerError, ErrorCode

#: The tasks ``anyformer run`` hands a file to, and what it does with them.
FILE_TASKS = {"automatic-speech-recognition": "transcribes"}


def run_on_file(loaded: Loaded, path: str | None, args: argparse.Namespace) -> int:
    """Run ``loaded`` on the file at ``path`` and print its text (``--json``: the whole result)."""
    if path is None or not os.path.isfile(os.path.expanduser(path)):
        given = f" ({path!r:.80} is not a file)" if path else ""
        raise AnyformerError(
            ErrorCode.BAD_REQUEST,
            f"{loaded.model.ref} {FILE_TASKS[loaded.task]} audio: give the file, `anyformer run MODEL clip.wav`{given}",
        )
    result = loaded.run(_audio_input(os.path.expanduser(path)))
    if args.json:
        print(json.dumps(result, ensure_ascii=False, default=str))
    else:
        print(result.get("text", "") if isinstance(result, dict) else result)
    return 0


def _audio_input(path: str) -> Any:
    if importlib.util.find_spec("av") is None:
        return path
    from anyformer._audio_decode import WHISPER_RATE, decode_audio

    with open(path, "rb") as file:
        return {"raw": decode_audio(file.read()), "sampling_rate": WHISPER_RATE}
