"""The wgpu engines: the MoE one (:mod:`.moe`), its prompt steps, and those of the families that differ from it."""
