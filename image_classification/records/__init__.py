"""The run's records on disk: written atomically, read within bounds, proven by a content hash.

:mod:`.workspace` (the folder a run writes into: its checks, its lock, what a killed run left),
:mod:`.checkpoint` (checkpoint and weights files, written atomically and read as data only),
:mod:`.safetensors_file` (weights as safetensors: the header held to its bounds, our record in the metadata),
:mod:`.integrity` (the hash every file written carries), :mod:`.raport` (the DLLogger-format raport),
:mod:`.datafile` (the toolkit's own files, read within bounds), :mod:`.scratch` (an export's scratch folders).

May import: errors.
"""
