"""Config files of the experiment scripts (see experiments/_config.py)."""
