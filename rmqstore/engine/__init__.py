"""The writer: :class:`~.store.MessageStore` (:mod:`.store`) appends records
(:mod:`.append`, batches as columns in :mod:`.batch`), dispatches them into ConsumeQueues and
IndexFiles (:mod:`.dispatch`, reopen state in :mod:`.reput`) and makes them durable
(:mod:`.flush`, :mod:`.logics_flush`); :mod:`.broker` is the append input and what a
broker changes in a message.
"""
