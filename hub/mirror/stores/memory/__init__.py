"""The memory kind of mirror store: every repo, ref and blob in this process's memory.

For unit tests, as httpx's ``MockTransport`` is for transports: real bytes and real
checks (a blob is served only while it hashes to its name), no storage. ``memory://NAME``
names one store per process (:func:`~.open_memory`).
"""
