"""tfopt's metadata is in pyproject.toml (PEP 621); this shim keeps
`python setup.py ...` and older tools working."""

from setuptools import setup

setup()
