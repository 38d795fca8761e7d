"""Storage policy: how stored pixel data is (re-)encoded (transcode.py)."""
