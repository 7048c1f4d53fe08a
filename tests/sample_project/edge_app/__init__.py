"""edge-app: a small image classifier shipped to phones with the Lite Interpreter."""

__version__ = "0.3.0"
