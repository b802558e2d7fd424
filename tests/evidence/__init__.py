"""The harnesses' own tests, which are also CI's checks of the committed records in docs/evidence/."""
