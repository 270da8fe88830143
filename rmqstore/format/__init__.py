"""The store's bytes and the broker's rules, with no files or threads: where every field sits
(:mod:`.layout`), a message and its small encodings (:mod:`.message`), one record's bytes
(:mod:`.record`), what dispatch derives from a record (:mod:`.rules`), the Java hashes
(:mod:`.hashing`), BODYCRC (:mod:`.crc`), body compression (:mod:`.compression`) and a DLedger
CommitLog's entries (:mod:`.dledger_layout`).
"""
