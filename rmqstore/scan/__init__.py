"""Many records at once, over memory maps, with numpy: records as columns
(:mod:`.records`), CommitLog byte-range splits (:mod:`.splits`), forked workers
(:mod:`.parallel`), what dispatch derives from a range in bulk (:mod:`.dispatch`), a
worker's units grouped per queue (:mod:`.per_queue`), properties found by name
(:mod:`.properties`) and Arrow columns (:mod:`.arrow`).
"""
