"""The instance lifecycle (issue 27): updates of stored instances as new versions
(update.py), the versions kept and restored (versions.py)."""
