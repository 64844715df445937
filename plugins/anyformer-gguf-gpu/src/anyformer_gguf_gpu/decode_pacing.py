"""How the decode loop paces its submissions: the engine sizes its read-back ring from these at load, and
the loop in ``decode`` reads them at each reply (a module of its own so that neither imports the other)."""

from __future__ import annotations

#: Submissions in flight before the host reads ids back (2: the GPU runs one while the host reads the other's).
LAG = 2
#: Decode steps per submission after the first: each submission costs the GPU a gap (the host's submit
#: waits for wgpu's poll, then the GPU starts the new work), so several tokens share one. A stop token
#: may thus run up to this many steps more, whose ids are discarded.
STEPS = 4
