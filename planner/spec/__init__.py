"""Specifications: model, hardware, training setup. Values are frozen dataclasses built from
plain mappings (YAML, JSON); every error names the file, the key and what was expected."""
