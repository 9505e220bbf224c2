"""Command-line commands, one module each (see parallax_nb/__main__.py)."""
