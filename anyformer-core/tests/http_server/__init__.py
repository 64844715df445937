"""The server's tests (a package, so its conftest does not shadow the top-level one)."""
