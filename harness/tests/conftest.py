"""The harnesses' own tests: they check the committed records in docs/evidence/ and docs/MATRIX.md when
the records are written (``make evidence``), not in the fast tier: a record is a dated run, and a patch
added or removed since does not make it wrong."""
