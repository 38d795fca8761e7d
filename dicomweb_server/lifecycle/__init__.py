"""The life of stored instances after they are stored (issue 27): rejection (reject.py),
updates of stored instances as new versions (update.py), the versions kept and restored
(versions.py)."""
