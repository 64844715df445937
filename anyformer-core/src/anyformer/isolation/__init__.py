"""Isolated workers: an engine in a child process behind length-prefixed JSON frames."""
