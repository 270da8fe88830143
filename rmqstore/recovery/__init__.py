"""Offline checks and fixes: what they report (:mod:`.findings`, one vocabulary of codes),
:mod:`.verify` and its checks (:mod:`.verify_cq`,
:mod:`.verify_index`, :mod:`.verify_state`), :mod:`.repair` (planned from verify's findings,
run step by step in :mod:`.repair_steps`, journaled and undone in :mod:`.journal` and
:mod:`.undo`), :mod:`.rebuild` (with :mod:`.rebuild_writers`), and the evidence a writing
command needs before it removes anything (:mod:`.guard`).
"""
