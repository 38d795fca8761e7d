"""HL7 v2 orders into the modality worklist: ORM^O01 on an MLLP port (hl7v2.py, mllp.py)."""
