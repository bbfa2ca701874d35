"""The chaos run: a real fleet of guarded workers under real faults (``python -m chaos``; see ``__main__``)."""
