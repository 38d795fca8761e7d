"""The life of stored instances after they are stored (issue 27): rejection (reject.py)."""
