"""Django-free coherence between the processes of a host.

``table`` is the generation table every TieredCache checks before it serves an
L1 hit (and that ShardedSQLiteCache stamps); ``board`` is the value board that
lets a reader take another process's fresh write without an L2 read;
``shared_file`` is the one helper that creates, allocates and checks the files
they live in. The cross-host transport will sit beside them.
"""

from djcachebench.coherence.table import (
    EPOCH_OFFSET,
    KEEP,
    STAMP_WAIT,
    TOKEN,
    U64,
    GenerationTable,
    TableStats,
    Token,
    open_table,
)

__all__ = [
    "EPOCH_OFFSET", "KEEP", "STAMP_WAIT", "TOKEN", "U64", "GenerationTable", "TableStats", "Token",
    "open_table",
]
