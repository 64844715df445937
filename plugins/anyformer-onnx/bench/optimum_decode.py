"""optimum's ORTModelForCausalLM on one ONNX folder, driven line by line by bench_decode.py (bench only).

optimum-onnx 0.1.0 imports only with transformers 4.x, so it runs in a venv of its own, never in a
distribution's dependencies::

    python -m venv /work/venvs/optimum-bench
    echo <base venv's site-packages> > /work/venvs/optimum-bench/lib/python3.11/site-packages/zz_base.pth
    /work/venvs/optimum-bench/bin/pip install "optimum-onnx[onnxruntime]==0.1.0" "optimum~=2.1.0" \
        "transformers>=4.56,<4.58"

(the ``.pth`` line lends it the base venv's torch and onnxruntime, behind its own transformers 4.x).
Arguments: folder, graph path inside it, threads (0: onnxruntime's default). It prints ``ready``, then
for each line ``{"messages": [...], "tokens": N}`` on stdin answers one JSON line
``{"speed": tok/s after the first token, "ids": [new token ids]}`` (greedy ``generate``).
"""

from __future__ import annotations

import json
import sys
import tempfile
import time
from pathlib import Path
from typing import Any


class _Clock:
    """A ``generate`` streamer that notes when each new token arrives (the first ``put`` is the prompt)."""

    def __init__(self) -> None:
        self.times: list[float] = []
        self.cpu_times: list[float] = []
        self.prompt_seen = False

    def put(self, value: Any) -> None:
        if not self.prompt_seen:
            self.prompt_seen = True
            return
        self.times.append(time.perf_counter())
        self.cpu_times.append(time.process_time())  # CPU time of this process, not waits for a core

    def end(self) -> None:
        """Nothing to flush."""


def main() -> None:
    folder, graph, threads = Path(sys.argv[1]), Path(sys.argv[2]), int(sys.argv[3])
    import onnxruntime
    from optimum.onnxruntime import ORTModelForCausalLM
    from transformers import PreTrainedTokenizerFast

    # The GGUF-derived config.json carries a null quantization_config, which transformers 4.x cannot
    # print: optimum reads a flat scratch folder of links to the same files (the graph's folder and
    # the model folder), with that key dropped.
    scratch = Path(tempfile.mkdtemp(prefix="optimum-bench-"))
    for entry in [*(folder / graph.parent).iterdir(), *folder.iterdir()]:
        if entry.is_file() and entry.name != "config.json" and not (scratch / entry.name).exists():
            (scratch / entry.name).symlink_to(entry)
    settings = json.loads((folder / "config.json").read_text())
    settings.pop("quantization_config", None)
    (scratch / "config.json").write_text(json.dumps(settings))
    folder = scratch

    options = onnxruntime.SessionOptions()
    if threads:
        options.intra_op_num_threads = threads
        options.inter_op_num_threads = 1
    model = ORTModelForCausalLM.from_pretrained(
        folder,
        file_name=graph.name,
        use_cache=True,
        use_io_binding=False,
        provider="CPUExecutionProvider",
        session_options=options,
    )
    # tokenizer_config.json names transformers 5's TokenizersBackend: build the fast tokenizer directly.
    tokenizer = PreTrainedTokenizerFast(tokenizer_file=str(folder / "tokenizer.json"))
    tokenizer.chat_template = (folder / "chat_template.jinja").read_text()
    print("ready", flush=True)
    for line in sys.stdin:
        request = json.loads(line)
        ids = tokenizer.apply_chat_template(request["messages"], add_generation_prompt=True, return_tensors="pt")
        clock = _Clock()
        out = model.generate(
            ids,
            attention_mask=ids.new_ones(ids.shape),
            max_new_tokens=request["tokens"],
            do_sample=False,
            streamer=clock,
        )
        new = out[0, ids.shape[1] :].tolist()
        times = clock.times
        speed = (len(times) - 1) / (times[-1] - times[0]) if len(times) > 1 and times[-1] > times[0] else 0.0
        cpu = clock.cpu_times
        cpu_speed = (len(cpu) - 1) / (cpu[-1] - cpu[0]) if len(cpu) > 1 and cpu[-1] > cpu[0] else 0.0
        answer = {"speed": speed, "cpu_speed": cpu_speed, "ids": new, "prompt_tokens": int(ids.shape[1])}
        print(json.dumps(answer), flush=True)


if __name__ == "__main__":
    main()
