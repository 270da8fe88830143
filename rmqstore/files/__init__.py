"""The store's files, one module per kind: CommitLog segments (:mod:`.segments`, read side
:mod:`.commitlog`), ConsumeQueues (:mod:`.consumequeue`), IndexFiles (:mod:`.index`,
:mod:`.index_geometry`), checkpoint/abort/lock (:mod:`.checkpoint`), a DLedger CommitLog
(:mod:`.dledger`, its files and state in :mod:`.dledger_files`); the configuration
checked against them (:mod:`.config`, :mod:`.geometry`, :mod:`.storekind` with
:mod:`.storekind_detect` and :mod:`.storekind_profile`); and the safe
ways to reach files: listings that never follow links (:mod:`.listing`), maps that never
end in SIGBUS (:mod:`.mapped`), names from disk (:mod:`.names`), sparse copies
(:mod:`.sparse`), the shared note of the file being mapped (:mod:`.notes`).
"""
