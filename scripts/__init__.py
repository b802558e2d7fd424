"""The CPU-side tools. A package only so that tests/, bench/ and harness/ import ``scripts.venvs``;
nothing here imports them."""
