"""The GPU harnesses: what runs this project's evidence on an H200, apart from the product.

Each is a module run from the repository root (``python3 -m harness.e2e_h200 ...``); see
harness/README.md. Nothing here is part of the ``dspark_hotfix`` package or its wheel.
"""
