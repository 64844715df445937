"""A step's dispatches bound once at load, whose per-step shape is a write into one uniform buffer.

A step over ``n`` tokens encodes the same pipelines over the same buffers for every ``n`` above 1;
only the uniform blocks (token counts, the head's input offset) and the workgroup counts change.
A :class:`BoundProgram` holds the bind groups of one step's dispatches built at load (with the
alternatives a step picks from, as the argmax or the sampler), their uniform blocks side by side in
one buffer (one block every ``min-uniform-buffer-offset-alignment`` bytes). A step of another shape
reuses them: its blocks are written into that buffer (one queue write, ordered before the step's
submission) and its workgroup counts replace the bound ones. Nothing is created on the GPU
after load, however many prompt lengths come; the host keeps a few recent shapes' blocks.
"""

from __future__ import annotations

import collections
import dataclasses
from collections.abc import Callable, Hashable, Sequence

import numpy as np

from anyformer_gguf_gpu.kernels import Dispatch, Kernels

#: Step shapes whose uniform blocks and dispatches a program keeps on the host (prefill alternates few).
KEPT_SHAPES = 8


class BoundProgram:
    """Dispatches bound at load from ``specs`` (made inside :meth:`Kernels.unbound`): a step's, with alternatives."""

    def __init__(self, kernels: Kernels, specs: Sequence[Dispatch], *, label: str = "program") -> None:
        if not specs or any(spec.bind_group is not None for spec in specs):
            raise ValueError("a bound program is made from unbound dispatches (Kernels.unbound)")
        gpu = kernels.gpu
        align = int(gpu.limits.get("min-uniform-buffer-offset-alignment", 256))
        widest = max(len(spec.params) for spec in specs)
        #: Bytes between two dispatches' uniform blocks in :attr:`uniforms`.
        self.stride = -(-widest // align) * align
        self.gpu = gpu
        self.uniforms = gpu.buffer(self.stride * len(specs), label=f"{label}-params", uniform=True)
        gpu.write(self.uniforms, self._blocks(specs))
        self.dispatches = [kernels.bind(spec, self.uniforms, i * self.stride) for i, spec in enumerate(specs)]
        # What the uniform buffer holds now (None: the shape it was bound with).
        self._written: Hashable = None
        self._shapes: collections.OrderedDict[Hashable, tuple[np.ndarray, list[Dispatch]]] = collections.OrderedDict()

    def _blocks(self, specs: Sequence[Dispatch], slots: Sequence[int] | None = None) -> np.ndarray:
        """The uniform buffer's bytes with ``specs``' blocks at ``slots`` (0, 1, ... by default)."""
        out = np.zeros((len(specs) if slots is None else max(slots) + 1, self.stride), dtype=np.uint8)
        for i, spec in enumerate(specs):
            out[i if slots is None else slots[i], : len(spec.params)] = np.frombuffer(spec.params, dtype=np.uint8)
        return out.reshape(-1)

    def shaped(self, key: Hashable, make: Callable[[], tuple[Sequence[int], Sequence[Dispatch]]]) -> list[Dispatch]:
        """A step of another shape: ``make()`` gives which bound dispatches it encodes (their indices) and the
        step's unbound dispatches (the same kernels over the same buffers, in another shape); the bound ones
        are returned with those workgroup counts, their uniform blocks written into the GPU's copy.

        ``key`` names the step (``make`` is called once per key while it is kept). Call this right before
        submitting the step: the write is ordered before later submissions, after earlier ones.
        """
        found = self._shapes.get(key)
        if found is None:
            slots, specs = make()
            found = self._shape(list(slots), list(specs))
            self._shapes[key] = found
            while len(self._shapes) > KEPT_SHAPES:
                self._shapes.popitem(last=False)
        else:
            self._shapes.move_to_end(key)
        if self._written != key:
            self.gpu.write(self.uniforms, found[0])
            self._written = key
        return found[1]

    def _shape(self, slots: list[int], specs: list[Dispatch]) -> tuple[np.ndarray, list[Dispatch]]:
        if len(slots) != len(specs):
            raise ValueError(f"{len(specs)} dispatches for {len(slots)} bound ones")
        out = []
        for spec, slot in zip(specs, slots, strict=True):
            bound = self.dispatches[slot]
            same = spec.pipeline is bound.pipeline and len(spec.params) == len(bound.params)
            same = same and len(spec.buffers) == len(bound.buffers)
            if not same or any(a is not b for a, b in zip(spec.buffers, bound.buffers, strict=True)):
                raise RuntimeError(f"a step's {spec.name} dispatch differs from the one bound at load")
            out.append(dataclasses.replace(bound, groups=spec.groups, params=spec.params))
        return self._blocks(specs, slots), out

    def release(self) -> None:
        """Free the uniform buffer (the bind groups go with the program)."""
        self._shapes.clear()
        self.dispatches = []
        self.uniforms.destroy()
