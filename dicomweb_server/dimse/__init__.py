"""DIMSE front door (PS3.7, PS3.4 Annexes A, B, C): C-ECHO, C-STORE, C-FIND, C-GET
and C-MOVE over pynetdicom, into the same archive as the DICOMweb front door.

scp.py (association policy, handlers, the listener), find.py (C-FIND over the QIDO-RS
query model), retrieve.py (C-GET/C-MOVE matching), peers.py (AE title -> address),
status.py (status values).
"""
