"""The numpy engines: the MoE one (:mod:`.moe`) and those of the families that differ from it."""
