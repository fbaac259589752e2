"""The `reach` command line (typer)."""
