__version__ = "0.1.0"

PROTOCOL_VERSION = 2
"""The version of the wire protocol this runtime speaks (docs/protocol.md, *Protocol
version*): what it writes and reads in Redis -- envelope, reply and chunk, the key layout,
the scripts' contracts. Written into each agent's registry record (field ``protocol``), so
a fleet of several languages and versions can check what its members speak. A compatible
change (a new optional field, key or script) keeps it; any other change raises it."""
